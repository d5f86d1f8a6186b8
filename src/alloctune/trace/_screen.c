/* The fast-token run of `alloctune.trace.pickle_scan.screen`, in C.
 *
 * Why: the screen proves a snapshot's pickle stream holds only opcodes that cannot run code,
 * grow the unpickler's memo or nest tuples, before the C unpickler builds it. Done with one
 * regular expression it costs about 0.7x the load itself (the regex engine spends ~25 ns per
 * opcode), which kept the first safe load at ~2x a plain pickle.load. This function returns
 * exactly what `_patterns()[0].match(data, pos, end).end()` returns: where the run of fast
 * tokens starting at `pos` stops, each token lying wholly before `end`. It reads bytes only
 * inside [pos, end) of the caller's buffer and builds nothing; everything else the screen does
 * (STOP, long strings, tuples and their operands) stays in Python.
 * tests/test_trace_fast_pickle.py holds it to the regex on real snapshots and mutated streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Bytes one fast token takes, or 0 when no fast token starts at d[pos] within end. */
static Py_ssize_t token_length(const unsigned char *d, Py_ssize_t pos, Py_ssize_t end) {
    Py_ssize_t need;
    switch (d[pos]) {
    case 0x6A: /* LONG_BINGET */
    case 0x4A: /* BININT */
        need = 5;
        break;
    case 0x68: /* BINGET */
    case 0x4B: /* BININT1 */
        need = 2;
        break;
    case 0x4D: /* BININT2 */
        need = 3;
        break;
    case 0x95: /* FRAME */
    case 0x47: /* BINFLOAT */
        need = 9;
        break;
    case 0x94: /* MEMOIZE */
    case 0x28: /* MARK */
    case 0x7D: /* EMPTY_DICT */
    case 0x75: /* SETITEMS */
    case 0x5D: /* EMPTY_LIST */
    case 0x65: /* APPENDS */
    case 0x61: /* APPEND */
    case 0x73: /* SETITEM */
    case 0x4E: /* NONE */
    case 0x88: /* NEWTRUE */
    case 0x89: /* NEWFALSE */
        need = 1;
        break;
    case 0x80: /* PROTO 2..5 */
        if (end - pos < 2 || d[pos + 1] < 2 || d[pos + 1] > 5)
            return 0;
        need = 2;
        break;
    case 0x8A: /* LONG1 */
    case 0x8C: /* SHORT_BINUNICODE */
    case 0x43: /* SHORT_BINBYTES */
        if (end - pos < 2)
            return 0;
        need = 2 + (Py_ssize_t)d[pos + 1];
        break;
    default:
        return 0;
    }
    return end - pos >= need ? need : 0;
}

static PyObject *run_end(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &pos, &end))
        return NULL;
    if (end > buf.len)
        end = buf.len;
    if (pos < 0 || pos > end) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "run_end: pos outside the buffer");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (pos >= end)
            break;
        Py_ssize_t n = token_length(d, pos, end);
        if (n == 0)
            break;
        pos += n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(pos);
}

static PyMethodDef methods[] = {
    {"run_end", run_end, METH_VARARGS,
     "run_end(data, pos, end) -> where the run of fast pickle tokens starting at pos stops (see _screen.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_screen", "The fast-token run of alloctune's pickle screen (see _screen.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__screen(void) { return PyModule_Create(&moddef); }
