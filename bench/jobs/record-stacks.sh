# the recording cost of Python stacks per allocation (bench/driver_cost.py stacks; sequential, ~3 min)
# limit: 300 s
python3 bench/driver_cost.py stacks
