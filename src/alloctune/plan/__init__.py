"""Capacity planning: the largest input that fits a card, and the card an input needs.

Recordings of one program at several input sizes become a size-parametric trace
(`traceset.build`: aligned streams, an exact size law per request), saved in a compact
versioned file (`fileformat`); `answer.plan` replays the generated stream for any size with
the exact simulator to find, per allocator setting, the largest size each card or cap
completes, the min budget as a function of size, and the card one size needs.
Pure core: never imports torch.
"""
