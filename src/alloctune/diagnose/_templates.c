/* A message template's match, figures and normalised text, in C (`alloctune.diagnose.fast`);
 * and the leftmost of several needles in a text (`alloctune.diagnose.platform`).
 *
 * Why: a log of distinct OOM messages is read one message at a time through the template of its
 * shape (`fast.Template`). In Python that is a regex match, a dozen `float`/`round` calls and a
 * whitespace collapse: about 10 us a message, a third of the whole diagnosis. Here one call does
 * all three, with exactly the semantics of the template's regular expression and of
 * `fast.collapse`; the regex path stays as the reference and the fallback (the extension is
 * optional; ALLOCTUNE_TEMPLATES=python forces it), and tests/test_diagnose_native.py holds the
 * two to the same reports on real and mutated logs.
 *
 * A program is what `fast._program` makes of a template: literal runs, blank runs
 * (`[ \t\r\n]+`), a mark or its full-width form (`[;\uFF1B]`), whole numbers (`([0-9]+)`) and sizes
 * (`([0-9]+(?:\.[0-9]+)?) *(bytes|[KMGTP]i?B)(?![A-Za-z])`). Each of these matches deterministically
 * (no alternative ever needs backtracking: what follows a number, a blank run or a unit cannot
 * start with what they consume; `fast._program` declines a template where that is not so).
 * Digits are ASCII digits, as in the templates' regexes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

enum { OP_LIT = 0, OP_WS = 1, OP_EITHER = 2, OP_INT = 3, OP_SIZE = 4 };

typedef struct {
    int code;
    Py_ssize_t off, len; /* OP_LIT: the literal's code points in lits[off:off+len] */
    Py_ssize_t min;      /* OP_WS: blanks at least */
    Py_UCS4 a, b;        /* OP_EITHER: the mark and its full-width form */
} Op;

/* The 11 units a size may print, numbered as `unit_at` returns them. */
#define N_UNITS 11
static const char *UNIT_NAMES[N_UNITS] = {"bytes", "KB", "KiB", "MB", "MiB", "GB", "GiB", "TB", "TiB", "PB", "PiB"};

typedef struct {
    Py_ssize_t n_ops;
    Op *ops;
    Py_UCS4 *lits;
    Py_ssize_t n_values;
    double mult[N_UNITS];
    int has_mult[N_UNITS];
} Program;

static const char *CAPSULE = "alloctune.diagnose._templates.Program";

static void program_free(PyObject *capsule) {
    Program *p = (Program *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (p == NULL)
        return;
    PyMem_Free(p->ops);
    PyMem_Free(p->lits);
    PyMem_Free(p);
}

/* compile(ops, mults): ops a sequence of ("lit", str) | ("ws", n) | ("either", "ab") | ("int",) |
 * ("size",); mults the unit -> multiplier dict. Returns the program (a capsule). */
static PyObject *compile_program(PyObject *self, PyObject *args) {
    PyObject *ops, *mults;
    if (!PyArg_ParseTuple(args, "OO!", &ops, &PyDict_Type, &mults))
        return NULL;
    PyObject *seq = PySequence_Fast(ops, "ops must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    Program *p = PyMem_Calloc(1, sizeof(Program));
    if (p == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    p->ops = PyMem_Calloc(n ? n : 1, sizeof(Op));
    if (p->ops == NULL)
        goto nomem;
    for (Py_ssize_t i = 0; i < n; i++) { /* the literals' total length first */
        PyObject *op = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(op, 0)))
            goto bad;
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(op, 0), "lit") == 0) {
            if (PyTuple_GET_SIZE(op) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(op, 1)))
                goto bad;
            total += PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(op, 1));
        }
    }
    p->lits = PyMem_Calloc(total ? total : 1, sizeof(Py_UCS4));
    if (p->lits == NULL)
        goto nomem;
    total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PySequence_Fast_GET_ITEM(seq, i), *name = PyTuple_GET_ITEM(op, 0);
        Op *o = &p->ops[i];
        if (PyUnicode_CompareWithASCIIString(name, "lit") == 0) {
            PyObject *s = PyTuple_GET_ITEM(op, 1);
            o->code = OP_LIT;
            o->off = total;
            o->len = PyUnicode_GET_LENGTH(s);
            if (PyUnicode_AsUCS4(s, p->lits + total, o->len, 0) == NULL)
                goto fail;
            total += o->len;
        } else if (PyUnicode_CompareWithASCIIString(name, "ws") == 0) {
            if (PyTuple_GET_SIZE(op) != 2 || !PyLong_Check(PyTuple_GET_ITEM(op, 1)))
                goto bad;
            o->code = OP_WS;
            o->min = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 1));
            if (o->min < 1)
                goto bad;
        } else if (PyUnicode_CompareWithASCIIString(name, "either") == 0) {
            PyObject *s = PyTuple_GET_SIZE(op) == 2 ? PyTuple_GET_ITEM(op, 1) : NULL;
            if (s == NULL || !PyUnicode_Check(s) || PyUnicode_GET_LENGTH(s) != 2)
                goto bad;
            o->code = OP_EITHER;
            o->a = PyUnicode_READ_CHAR(s, 0);
            o->b = PyUnicode_READ_CHAR(s, 1);
        } else if (PyUnicode_CompareWithASCIIString(name, "int") == 0) {
            o->code = OP_INT;
            p->n_values++;
        } else if (PyUnicode_CompareWithASCIIString(name, "size") == 0) {
            o->code = OP_SIZE;
            p->n_values++;
        } else {
            goto bad;
        }
    }
    p->n_ops = n;
    for (int u = 0; u < N_UNITS; u++) {
        PyObject *m = PyDict_GetItemString(mults, UNIT_NAMES[u]); /* borrowed */
        if (m != NULL && PyLong_Check(m)) {
            p->mult[u] = PyLong_AsDouble(m); /* what float * int converts the int to */
            if (p->mult[u] == -1.0 && PyErr_Occurred())
                goto fail;
            p->has_mult[u] = 1;
        }
    }
    Py_DECREF(seq);
    PyObject *capsule = PyCapsule_New(p, CAPSULE, program_free);
    if (capsule == NULL) {
        PyMem_Free(p->ops);
        PyMem_Free(p->lits);
        PyMem_Free(p);
    }
    return capsule;
bad:
    PyErr_SetString(PyExc_ValueError, "compile: malformed op");
    goto fail;
nomem:
    PyErr_NoMemory();
fail:
    Py_DECREF(seq);
    PyMem_Free(p->ops);
    PyMem_Free(p->lits);
    PyMem_Free(p);
    return NULL;
}

static inline int is_blank(Py_UCS4 c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
static inline int is_ascii_letter(Py_UCS4 c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

/* The unit starting at text[i] as the size pattern reads it, its index and length; -1 if none. */
static int unit_at(int kind, const void *data, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *len) {
    static const char bytes[] = "bytes";
    if (i + 5 <= n) {
        int ok = 1;
        for (int k = 0; k < 5; k++)
            if (PyUnicode_READ(kind, data, i + k) != (Py_UCS4)bytes[k]) {
                ok = 0;
                break;
            }
        if (ok && !(i + 5 < n && is_ascii_letter(PyUnicode_READ(kind, data, i + 5)))) {
            *len = 5;
            return 0;
        }
    }
    if (i >= n)
        return -1;
    static const char prefixes[] = "KMGTP";
    const char *at = strchr(prefixes, (int)(PyUnicode_READ(kind, data, i) < 128 ? PyUnicode_READ(kind, data, i) : 0));
    if (at == NULL || *at == '\0')
        return -1;
    int base = 1 + 2 * (int)(at - prefixes);
    Py_ssize_t j = i + 1;
    int binary = 0;
    if (j < n && PyUnicode_READ(kind, data, j) == 'i') {
        /* `i?` greedy; without it the next character must be B, and it is 'i': no other way */
        binary = 1;
        j++;
    }
    if (j >= n || PyUnicode_READ(kind, data, j) != 'B')
        return -1;
    j++;
    if (j < n && is_ascii_letter(PyUnicode_READ(kind, data, j)))
        return -1;
    *len = j - i;
    return base + binary;
}

static inline int is_digit(Py_UCS4 c) { return c >= '0' && c <= '9'; }

/* A run of ASCII digits from text[i]: its end. */
static inline Py_ssize_t digits_end(int kind, const void *data, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && is_digit(PyUnicode_READ(kind, data, i)))
        i++;
    return i;
}

/* float(text[a:b]) * mult, rounded as round() rounds a float; NULL with no error set where the
 * Python way must decide (a result that is not finite). */
static PyObject *size_value(int kind, const void *data, Py_ssize_t a, Py_ssize_t b, double mult) {
    /* Most figures: ASCII digits, at most 15 of them: the integer of their digits and the power of
     * ten it is divided by are exact doubles, so the quotient is the correctly rounded value
     * float() gives (strtod is correctly rounded too). */
    if (b - a <= 16) {
        double m = 0.0;
        int frac = -1, simple = 1, nd = 0;
        for (Py_ssize_t i = a; i < b; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c >= '0' && c <= '9') {
                m = m * 10.0 + (double)(c - '0');
                nd++;
                if (frac >= 0)
                    frac++;
            } else if (c == '.' && frac < 0) {
                frac = 0;
            } else {
                simple = 0;
                break;
            }
        }
        if (simple && nd <= 15) {
            static const double TENS[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13,
                                          1e14, 1e15};
            double x = (frac > 0 ? m / TENS[frac] : m) * mult;
            if (isfinite(x)) {
                double r = round(x);
                if (fabs(x - r) == 0.5)
                    r = 2.0 * round(x / 2.0);
                return PyLong_FromDouble(r);
            }
        }
    }
    char small[64];
    char *buf = b - a < (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)(b - a) + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = a; i < b; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        buf[i - a] = (char)c; /* ASCII digits and the point */
    }
    buf[b - a] = '\0';
    char *end = NULL;
    double x = PyOS_string_to_double(buf, &end, NULL); /* float()'s parser; overflow gives +inf */
    int whole = end == buf + (b - a);
    if (buf != small)
        PyMem_Free(buf);
    if (x == -1.0 && PyErr_Occurred())
        return NULL;
    if (!whole)
        return NULL;
    x *= mult;
    if (!isfinite(x))
        return NULL;
    double r = round(x); /* float.__round__() without ndigits: half to even */
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    return PyLong_FromDouble(r);
}

/* int(text[a:b]) of decimal digits; NULL with no error set beyond 18 digits (a device or process
 * number that long is garbage: the Python way decides, and may refuse it). */
static PyObject *int_value(int kind, const void *data, Py_ssize_t a, Py_ssize_t b) {
    if (b - a > 18)
        return NULL;
    long long v = 0;
    for (Py_ssize_t i = a; i < b; i++)
        v = v * 10 + (long long)(PyUnicode_READ(kind, data, i) - '0');
    return PyLong_FromLongLong(v);
}

/* `fast.collapse(text[a:b])`: full-width marks in their ASCII form; then, when the text holds a
 * tab or a line break, `" ".join(text.split())`, else each run of spaces one space. */
static PyObject *collapse(PyObject *text, int kind, const void *data, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t n = b - a;
    int plain = 1; /* nothing to change: the slice itself (most messages) */
    for (Py_ssize_t i = a; i < b && plain; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == '\n' || c == '\t' || c == '\r' || (c >= 0xFF08 && c <= 0xFF1B) ||
            (c == ' ' && i + 1 < b && PyUnicode_READ(kind, data, i + 1) == ' '))
            plain = 0;
    }
    if (plain)
        return PyUnicode_Substring(text, a, b);
    Py_UCS4 *out = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_UCS4));
    if (out == NULL)
        return PyErr_NoMemory();
    int breaks = 0;
    for (Py_ssize_t i = a; i < b; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        switch (c) {
        case 0xFF1B: c = ';'; break;
        case 0xFF1A: c = ':'; break;
        case 0xFF08: c = '('; break;
        case 0xFF09: c = ')'; break;
        case 0xFF0C: c = ','; break;
        case '\n': case '\t': case '\r': breaks = 1; break;
        default: break;
        }
        out[i - a] = c;
    }
    Py_ssize_t k = 0;
    if (breaks) { /* split() on any whitespace, joined by one space */
        Py_ssize_t i = 0;
        while (i < n) {
            while (i < n && Py_UNICODE_ISSPACE(out[i]))
                i++;
            if (i >= n)
                break;
            if (k)
                out[k++] = ' ';
            while (i < n && !Py_UNICODE_ISSPACE(out[i]))
                out[k++] = out[i++];
        }
    } else { /* replace("  ", " ") until none is left: each run of spaces one space */
        for (Py_ssize_t i = 0; i < n; i++)
            if (!(out[i] == ' ' && k && out[k - 1] == ' '))
                out[k++] = out[i];
    }
    PyObject *s = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, k);
    PyMem_Free(out);
    return s;
}

/* match(program, text, s): None when the template does not match at text[s]; False when it
 * matches but a figure needs the Python way (a unit without a multiplier, a size that is not
 * finite, a whole number of more than 18 digits); else (end, values, normalised text), the values
 * in the order of the template's numbers. */
static PyObject *match(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "match(program, text, s)");
        return NULL;
    }
    Program *p = (Program *)PyCapsule_GetPointer(args[0], CAPSULE);
    if (p == NULL)
        return NULL;
    PyObject *text = args[1];
    Py_ssize_t s = PyLong_AsSsize_t(args[2]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (s < 0 || s > n)
        Py_RETURN_NONE;
    /* The numbers' spans first (nothing is built unless the whole template matches). */
    Py_ssize_t spans_small[3 * 16];
    Py_ssize_t *spans = p->n_values <= 16 ? spans_small : PyMem_Malloc((size_t)p->n_values * 3 * sizeof(Py_ssize_t));
    if (spans == NULL)
        return PyErr_NoMemory();
    Py_ssize_t i = s, v = 0;
    int ok = 1;
    for (Py_ssize_t k = 0; k < p->n_ops && ok; k++) {
        const Op *o = &p->ops[k];
        switch (o->code) {
        case OP_LIT:
            if (i + o->len > n) {
                ok = 0;
                break;
            }
            for (Py_ssize_t j = 0; j < o->len; j++)
                if (PyUnicode_READ(kind, data, i + j) != p->lits[o->off + j]) {
                    ok = 0;
                    break;
                }
            i += o->len;
            break;
        case OP_WS: {
            Py_ssize_t j = i;
            while (j < n && is_blank(PyUnicode_READ(kind, data, j)))
                j++;
            if (j - i < o->min)
                ok = 0;
            i = j;
            break;
        }
        case OP_EITHER: {
            Py_UCS4 c = i < n ? PyUnicode_READ(kind, data, i) : 0;
            if (i >= n || (c != o->a && c != o->b))
                ok = 0;
            i++;
            break;
        }
        case OP_INT: {
            Py_ssize_t j = digits_end(kind, data, i, n);
            if (j == i) {
                ok = 0;
                break;
            }
            spans[3 * v] = i;
            spans[3 * v + 1] = j;
            spans[3 * v + 2] = -1;
            v++;
            i = j;
            break;
        }
        case OP_SIZE: {
            Py_ssize_t j = digits_end(kind, data, i, n);
            if (j == i) {
                ok = 0;
                break;
            }
            if (j + 1 < n && PyUnicode_READ(kind, data, j) == '.' && is_digit(PyUnicode_READ(kind, data, j + 1)))
                j = digits_end(kind, data, j + 1, n);
            Py_ssize_t u = j, len = 0;
            while (u < n && PyUnicode_READ(kind, data, u) == ' ')
                u++;
            int unit = unit_at(kind, data, u, n, &len);
            if (unit < 0) {
                ok = 0;
                break;
            }
            spans[3 * v] = i;
            spans[3 * v + 1] = j;
            spans[3 * v + 2] = unit;
            v++;
            i = u + len;
            break;
        }
        }
    }
    PyObject *result = NULL;
    if (!ok) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *values = PyTuple_New(p->n_values);
    if (values == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < p->n_values; k++) {
        Py_ssize_t a = spans[3 * k], b = spans[3 * k + 1], unit = spans[3 * k + 2];
        PyObject *val;
        if (unit < 0) {
            val = int_value(kind, data, a, b);
        } else if (!p->has_mult[unit]) {
            val = NULL;
        } else {
            val = size_value(kind, data, a, b, p->mult[unit]);
        }
        if (val == NULL) {
            Py_DECREF(values);
            if (!PyErr_Occurred())
                result = Py_NewRef(Py_False);
            goto done;
        }
        PyTuple_SET_ITEM(values, k, val);
    }
    PyObject *norm = collapse(text, kind, data, s, i);
    if (norm == NULL) {
        Py_DECREF(values);
        goto done;
    }
    result = Py_BuildValue("(nNN)", i, values, norm); /* (N: the tuple takes both references) */
done:
    if (spans != spans_small)
        PyMem_Free(spans);
    return result;
}

/* key(text, s): `text[s:s+200].encode("utf-8", "surrogatepass").translate(None, b"0123456789")[:120]`,
 * the key a shape's templates are filed under (`fast.FastReader.key`). */
static PyObject *key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "key(text, s)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t s = PyLong_AsSsize_t(args[1]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (s < 0)
        s = 0;
    unsigned char out[120 + 4];
    Py_ssize_t k = 0;
    for (Py_ssize_t i = s; i < n && i < s + 200 && k < 120; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            if (c < '0' || c > '9')
                out[k++] = (unsigned char)c;
        } else if (c < 0x800) {
            out[k++] = (unsigned char)(0xC0 | (c >> 6));
            out[k++] = (unsigned char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) { /* surrogates too: surrogatepass writes them this way */
            out[k++] = (unsigned char)(0xE0 | (c >> 12));
            out[k++] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            out[k++] = (unsigned char)(0x80 | (c & 0x3F));
        } else {
            out[k++] = (unsigned char)(0xF0 | (c >> 18));
            out[k++] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            out[k++] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            out[k++] = (unsigned char)(0x80 | (c & 0x3F));
        }
    }
    return PyBytes_FromStringAndSize((const char *)out, k < 120 ? k : 120);
}

/* find_any(text, needles, start): where the leftmost occurrence of any of the needles (non-empty
 * strings) begins at or after `start`, or -1: `min(text.find(n, start) for n in needles)` over
 * those found, in one pass (`platform.PlatformIndex` asks it of every chunk of a big log, and most
 * logs of OOM messages hold no needle at all). */
static PyObject *find_any(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "find_any(text, needles: tuple, start)");
        return NULL;
    }
    PyObject *text = args[0], *needles = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    enum { MAX_NEEDLES = 64 };
    Py_ssize_t m = PyTuple_GET_SIZE(needles);
    if (m > MAX_NEEDLES) {
        PyErr_SetString(PyExc_ValueError, "find_any: at most 64 needles");
        return NULL;
    }
    int kinds[MAX_NEEDLES];
    const void *datas[MAX_NEEDLES];
    Py_ssize_t lens[MAX_NEEDLES];
    Py_UCS4 firsts[MAX_NEEDLES];
    unsigned long long bucket[128] = {0}; /* ASCII first character -> the needles that start with it */
    unsigned long long wide = 0;          /* needles that start with a non-ASCII character */
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *nd = PyTuple_GET_ITEM(needles, k);
        if (!PyUnicode_Check(nd) || PyUnicode_GET_LENGTH(nd) == 0) {
            PyErr_SetString(PyExc_ValueError, "find_any: needles must be non-empty strings");
            return NULL;
        }
        kinds[k] = PyUnicode_KIND(nd);
        datas[k] = PyUnicode_DATA(nd);
        lens[k] = PyUnicode_GET_LENGTH(nd);
        firsts[k] = PyUnicode_READ(kinds[k], datas[k], 0);
        if (firsts[k] < 128)
            bucket[firsts[k]] |= 1ULL << k;
        else
            wide |= 1ULL << k;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (start < 0)
        start = 0;
    const Py_UCS1 *bytes = kind == PyUnicode_1BYTE_KIND ? data : NULL;
    for (Py_ssize_t i = start; i < n; i++) {
        if (bytes != NULL) { /* most logs: skip what no needle starts with, byte by byte */
            while (i < n && !(bytes[i] < 128 ? bucket[bytes[i]] : wide))
                i++;
            if (i >= n)
                break;
        }
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        unsigned long long set = c < 128 ? bucket[c] : wide;
        for (int k = 0; set; k++, set >>= 1) { /* (portable: no bit-scan builtin on MSVC) */
            if (!(set & 1) || firsts[k] != c || i + lens[k] > n)
                continue;
            Py_ssize_t j = 1;
            while (j < lens[k] && PyUnicode_READ(kind, data, i + j) == PyUnicode_READ(kinds[k], datas[k], j))
                j++;
            if (j == lens[k])
                return PyLong_FromSsize_t(i);
        }
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"find_any", (PyCFunction)(void (*)(void))find_any, METH_FASTCALL,
     "find_any(text, needles, start): the leftmost start of any needle at or after start, or -1."},
    {"compile", compile_program, METH_VARARGS, "compile(ops, mults): a template's program."},
    {"match", (PyCFunction)(void (*)(void))match, METH_FASTCALL,
     "match(program, text, s): None, False (the Python way decides) or (end, values, normalised text)."},
    {"key", (PyCFunction)(void (*)(void))key, METH_FASTCALL, "key(text, s): the bytes a shape is filed under."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_templates", "Message templates' match, figures and normalised text (see _templates.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__templates(void) { return PyModule_Create(&moddef); }
