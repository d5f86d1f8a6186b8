/* alloctune.sim._native: the replay loop of alloctune/sim/replay.py, rule for rule, in C.
 *
 * Why: every answer alloctune gives from a recording is a batch of replays, and the Python
 * model spends ~2 us per request on object and SortedList overhead. This file runs the whole
 * per-request loop natively: blocks and segments are C structs, each (pool, stream) free set
 * is a treap ordered by the version's comparator, live allocations sit in an open-addressing
 * table. The Python model (allocator.py) stays the specification; tests/test_sim_native.py
 * replays every trace through both and requires identical results. Every statement below
 * mirrors a line of allocator.py / replay.py / expandable.py / driver.py.Device, in order,
 * so that statistics and event order match exactly.
 *
 * The driver's address choices: the two models of driver.py (`DriverVA`, `RecordedAddresses`)
 * have native twins here, rule for rule (a segment churned by empty_cache() every step asks
 * for an address as often as a request asks for a block, so a call back into Python per
 * segment would dominate); any other address model object is called back. Which one runs is
 * the Python side's choice (`AddressModel.native_spec`).
 *
 * A replay is a `Session`: it runs the requests up to an index and pauses there, can have
 * an empty_cache() put in between two requests, reports its allocator statistics while
 * paused, and can be copied (`clone`, native address models only) and go on under another
 * cap. Why: the allocator's only use of the cap is one comparison per device allocation
 * (reserved + size > cap, in alloc_block), so a run under cap c is the uncapped run until the
 * first comparison that c fails; a bisection over caps starts each capped run from a copy of
 * a state the runs share (`vmax`, `diverged` say when that holds), and a policy that decides
 * clean-ups from the statistics (the Janitor) is driven through one run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BLOCK 512
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)

enum { OP_ALLOC = 0, OP_FREE = 1, OP_EMPTY_CACHE = 2, OP_FAILED_ALLOC = 3 };
enum { EV_SEG_ALLOC = 0, EV_SEG_FREE = 1, EV_SEG_MAP = 2, EV_SEG_UNMAP = 3, EV_OOM = 4 };

typedef struct Seg {
    int64_t addr, size, stream, id;
    int small;
    int es; /* expandable segment */
    int64_t es_page;
    size_t idx; /* position in A.segs (O(1) removal) */
    struct Blk *head;
    struct Seg *twin; /* its copy, while a clone is being made */
} Seg;

typedef struct Blk {
    int64_t addr, size, requested, gc_base;
    int64_t k_size, k_id, k_addr; /* the key it was inserted with (Python's b.key) */
    Seg *seg;
    struct Blk *prev, *next; /* neighbours in the segment */
    struct Blk *l, *r;       /* treap children */
    struct Blk *twin;        /* its copy, while a clone is being made */
    uint32_t pri;
    uint8_t allocated, mapped;
} Blk;

typedef struct {
    int64_t stream;
    Blk *root;
} FSet;

typedef struct {
    int small;
    FSet *sets; /* sorted by stream (the C++ set orders streams by handle) */
    int nsets, capsets;
    FSet *um; /* unmapped expandable blocks per stream, ordered by address */
    int num, capum;
    int64_t calls; /* get_free_blocks_call_count */
} Pool;

typedef struct {
    int64_t alloc_count, alloc_peak, alloc_cum;
    int64_t allocated, allocated_peak, allocated_cum;
    int64_t requested, requested_peak, requested_cum;
    int64_t reserved, reserved_peak, reserved_cum;
    int64_t segments, segments_peak, segments_cum;
    int64_t inactive_split, inactive_split_peak, inactive_split_cum;
    int64_t inactive_split_bytes, inactive_split_bytes_peak, inactive_split_bytes_cum;
    int64_t oversize_allocations, oversize_allocations_peak, oversize_allocations_cum;
    int64_t oversize_segments, oversize_segments_peak, oversize_segments_cum;
    int64_t num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc, num_device_free;
} Stats;
#define NSTATS 32

typedef struct {
    int8_t action;
    int64_t addr, size, stream, ri;
} Event;

typedef struct {
    int64_t request_index, size, rounded, alloc_size, stream, reserved, allocated, device_free, largest;
} OOM;

typedef struct {
    int64_t key;
    Blk *b;
} LiveSlot;

/* driver.py's DriverVA: ranges other than 2 MiB top-down from `low`, freed ones kept as holes
 * sorted by (size, addr) like its SortedList of tuples; 2 MiB ranges upwards from `small_next`,
 * freed ones in a min-heap (its SortedList.pop(0) takes the lowest). */
typedef struct {
    int64_t size, addr;
} Hole;

typedef struct {
    int64_t low, small_next;
    Hole *holes;
    size_t nholes, capholes;
    int64_t *small;
    size_t nsmall, capsmall;
} VA;

/* The recorded (size, addr) pairs of RecordedAddresses: read-only, shared by a session's clones. */
typedef struct {
    size_t refs, n;
    int64_t *pairs; /* 2n values, stored right after the struct */
} RecTable;

/* driver.py's RecordedAddresses: the k-th segment at the recording's k-th address while that
 * range is free (`live`: (addr, size) pairs placed there), else at the fallback model's. */
typedef struct {
    RecTable *table;
    size_t count;
    int64_t diverged_at; /* -1: None */
    int64_t fallbacks;
    int64_t *live;
    size_t nlive, caplive;
    VA fallback;
} Rec;

enum { ADDR_PY = 0, ADDR_VA = 1, ADDR_REC = 2 };
/* A.error: 0, or ERR_PY (a Python exception is set: an address model called back failed), or
 * ERR_NOMEM (memory ran out; raised as MemoryError once back where the GIL is held: the request
 * loop runs without it when nothing in it calls Python) */
enum { ERR_PY = 1, ERR_NOMEM = 2 };

typedef struct {
    /* settings */
    int has_cap;
    int64_t cap;
    int gc_on;
    double gc_threshold;
    int has_mss;
    int64_t mss, nsr, mid_segment;
    int expandable;
    int has_table;
    int64_t table[16];
    int id_key;
    int record_events;
    /* device */
    int64_t total, overhead, usable, used;
    int seg_kind, va_kind; /* ADDR_*: where segment addresses / expandable reservations come from */
    PyObject *addr_alloc, *addr_free, *va_alloc, *va_free; /* ADDR_PY: the model's methods (owned) */
    VA seg_va, va;
    Rec rec;
    /* the cap comparisons: the largest `reserved + size` that passed, and whether one failed */
    int64_t vmax;
    int diverged;

    /* state */
    Pool small_pool, large_pool;
    int64_t next_seg_id;
    Stats st;
    int64_t request_index;
    int has_oom;
    OOM oom;
    Event *events;
    size_t nev, capev;
    uint32_t rng;
    int error; /* ERR_PY | ERR_NOMEM */
    /* block/segment memory */
    Blk *free_blks;
    Seg **segs;
    size_t nsegs, capsegs;
    void **chunks;
    size_t nchunks, capchunks;
} A;

/* ------------------------------------------------------------------ memory */
static int push_ptr(void ***arr, size_t *n, size_t *cap, void *p) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        void **na = realloc(*arr, nc * sizeof(void *));
        if (!na) return -1;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return 0;
}

static Blk *blk_new(A *a, int64_t addr, int64_t size, Seg *seg, int mapped) {
    if (!a->free_blks) {
        size_t n = 4096;
        Blk *chunk = malloc(n * sizeof(Blk));
        if (!chunk || push_ptr(&a->chunks, &a->nchunks, &a->capchunks, chunk)) {
            free(chunk);
            a->error = ERR_NOMEM;
            return NULL;
        }
        for (size_t i = 0; i < n; i++) {
            chunk[i].next = a->free_blks;
            a->free_blks = &chunk[i];
        }
    }
    Blk *b = a->free_blks;
    a->free_blks = b->next;
    memset(b, 0, sizeof(Blk));
    b->addr = addr;
    b->size = size;
    b->seg = seg;
    b->mapped = (uint8_t)mapped;
    /* xorshift32: deterministic treap priorities */
    uint32_t x = a->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    a->rng = x;
    b->pri = x;
    return b;
}

static void blk_del(A *a, Blk *b) {
    b->next = a->free_blks;
    a->free_blks = b;
}

/* ------------------------------------------------------------------ treap */
static inline int kcmp(int64_t s1, int64_t i1, int64_t a1, int64_t s2, int64_t i2, int64_t a2) {
    if (s1 != s2) return s1 < s2 ? -1 : 1;
    if (i1 != i2) return i1 < i2 ? -1 : 1;
    if (a1 != a2) return a1 < a2 ? -1 : 1;
    return 0;
}
#define NCMP(x, y) kcmp((x)->k_size, (x)->k_id, (x)->k_addr, (y)->k_size, (y)->k_id, (y)->k_addr)

/* split t into keys < n's key (l) and >= (r) */
static void t_split(Blk *t, Blk *n, Blk **l, Blk **r) {
    while (t) {
        if (NCMP(t, n) < 0) {
            *l = t;
            l = &t->r;
            t = t->r;
        } else {
            *r = t;
            r = &t->l;
            t = t->l;
        }
    }
    *l = NULL;
    *r = NULL;
}

static Blk *t_merge(Blk *l, Blk *r) {
    Blk *root = NULL, **p = &root;
    while (l && r) {
        if (l->pri > r->pri) {
            *p = l;
            p = &l->r;
            l = l->r;
        } else {
            *p = r;
            p = &r->l;
            r = r->l;
        }
    }
    *p = l ? l : r;
    return root;
}

static void t_insert(Blk **root, Blk *n) {
    Blk **p = root;
    while (*p && (*p)->pri > n->pri) p = NCMP(n, *p) < 0 ? &(*p)->l : &(*p)->r;
    t_split(*p, n, &n->l, &n->r);
    *p = n;
}

static void t_remove(Blk **root, Blk *n) {
    Blk **p = root;
    while (*p != n) {
        if (!*p) return; /* not present: cannot happen when the model is consistent */
        p = NCMP(n, *p) < 0 ? &(*p)->l : &(*p)->r;
    }
    *p = t_merge(n->l, n->r);
    n->l = n->r = NULL;
}

/* first node with key >= (s, i, ad) */
static Blk *t_lower(Blk *t, int64_t s, int64_t i, int64_t ad) {
    Blk *best = NULL;
    while (t) {
        if (kcmp(t->k_size, t->k_id, t->k_addr, s, i, ad) >= 0) {
            best = t;
            t = t->l;
        } else {
            t = t->r;
        }
    }
    return best;
}

static Blk *t_succ(Blk *t, Blk *n) {
    Blk *best = NULL;
    while (t) {
        if (NCMP(t, n) > 0) {
            best = t;
            t = t->l;
        } else {
            t = t->r;
        }
    }
    return best;
}

static Blk *t_pred(Blk *t, Blk *n) {
    Blk *best = NULL;
    while (t) {
        if (NCMP(t, n) < 0) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

static Blk *t_min(Blk *t) {
    if (t)
        while (t->l) t = t->l;
    return t;
}

static Blk *t_max(Blk *t) {
    if (t)
        while (t->r) t = t->r;
    return t;
}

/* ------------------------------------------------------------------ per-stream sets */
static FSet *set_find(FSet *sets, int n, int64_t stream) {
    for (int i = 0; i < n; i++)
        if (sets[i].stream == stream) return &sets[i];
    return NULL;
}

static FSet *set_get(A *a, FSet **sets, int *n, int *cap, int64_t stream) {
    FSet *f = set_find(*sets, *n, stream);
    if (f) return f;
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 4;
        FSet *ns = realloc(*sets, nc * sizeof(FSet));
        if (!ns) {
            a->error = ERR_NOMEM;
            return NULL;
        }
        *sets = ns;
        *cap = nc;
    }
    int i = *n;
    while (i > 0 && (*sets)[i - 1].stream > stream) {
        (*sets)[i] = (*sets)[i - 1];
        i--;
    }
    (*sets)[i].stream = stream;
    (*sets)[i].root = NULL;
    (*n)++;
    return &(*sets)[i];
}

/* insert_into_blocks: into the free set, resetting the block's GC age */
static void fs_insert(A *a, Pool *pool, Blk *b) {
    FSet *fs = set_get(a, &pool->sets, &pool->nsets, &pool->capsets, b->seg->stream);
    if (!fs) return;
    b->k_size = b->size;
    b->k_id = a->id_key ? b->seg->id : 0;
    b->k_addr = b->addr;
    b->gc_base = pool->calls;
    b->l = b->r = NULL;
    t_insert(&fs->root, b);
}

static void fs_remove(Pool *pool, Blk *b) {
    FSet *fs = set_find(pool->sets, pool->nsets, b->seg->stream);
    if (fs) t_remove(&fs->root, b);
}

static void um_add(A *a, Pool *pool, Blk *b) {
    FSet *fs = set_get(a, &pool->um, &pool->num, &pool->capum, b->seg->stream);
    if (!fs) return;
    b->k_size = 0;
    b->k_id = 0;
    b->k_addr = b->addr;
    b->l = b->r = NULL;
    t_insert(&fs->root, b);
}

static void um_remove(Pool *pool, Blk *b) {
    FSet *fs = set_find(pool->um, pool->num, b->seg->stream);
    if (fs) t_remove(&fs->root, b);
}

/* ------------------------------------------------------------------ stats */
static inline void st_inactive_change(Stats *st, int64_t n, int64_t nbytes) {
    if (n) {
        st->inactive_split += n;
        if (n > 0) {
            st->inactive_split_cum += n;
            if (st->inactive_split > st->inactive_split_peak) st->inactive_split_peak = st->inactive_split;
        }
    }
    if (nbytes) {
        st->inactive_split_bytes += nbytes;
        if (nbytes > 0) {
            st->inactive_split_bytes_cum += nbytes;
            if (st->inactive_split_bytes > st->inactive_split_bytes_peak)
                st->inactive_split_bytes_peak = st->inactive_split_bytes;
        }
    }
}

static inline void st_reserved_inc(Stats *st, int64_t n) {
    st->reserved += n;
    st->reserved_cum += n;
    if (st->reserved > st->reserved_peak) st->reserved_peak = st->reserved;
}

/* ------------------------------------------------------------------ events / callbacks */
static void event(A *a, int action, int64_t addr, int64_t size, int64_t stream) {
    if (!a->record_events) return;
    if (a->nev == a->capev) {
        size_t nc = a->capev ? a->capev * 2 : 256;
        Event *ne = realloc(a->events, nc * sizeof(Event));
        if (!ne) {
            a->error = ERR_NOMEM;
            return;
        }
        a->events = ne;
        a->capev = nc;
    }
    Event *e = &a->events[a->nev++];
    e->action = (int8_t)action;
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    e->ri = a->request_index;
}

static int64_t call_alloc(A *a, PyObject *fn, int64_t size) {
    PyObject *r = PyObject_CallFunction(fn, "L", (long long)size);
    if (!r) {
        a->error = ERR_PY;
        return 0;
    }
    int64_t v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) a->error = ERR_PY;
    return v;
}

static void call_free(A *a, PyObject *fn, int64_t addr, int64_t size) {
    PyObject *r = PyObject_CallFunction(fn, "LL", (long long)addr, (long long)size);
    if (!r)
        a->error = ERR_PY;
    else
        Py_DECREF(r);
}

/* ------------------------------------------------------------------ native address models */
/* room for `need` items of `elem` bytes in *p (capacity *cap) */
static int reserve(A *a, void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) {
        a->error = ERR_NOMEM;
        return -1;
    }
    *p = np;
    *cap = nc;
    return 0;
}

static void va_init(VA *v, int64_t top, int64_t small_region) {
    memset(v, 0, sizeof(VA));
    v->low = top;
    v->small_next = top - small_region;
}

/* SortedList.add((size, addr)): after the holes that sort before or equal to it */
static void hole_add(A *a, VA *v, int64_t size, int64_t addr) {
    if (reserve(a, (void **)&v->holes, &v->capholes, v->nholes + 1, sizeof(Hole))) return;
    size_t lo = 0, hi = v->nholes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        Hole *h = &v->holes[mid];
        if (h->size < size || (h->size == size && h->addr <= addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(&v->holes[lo + 1], &v->holes[lo], (v->nholes - lo) * sizeof(Hole));
    v->holes[lo].size = size;
    v->holes[lo].addr = addr;
    v->nholes++;
}

static void heap_push(A *a, VA *v, int64_t x) {
    if (reserve(a, (void **)&v->small, &v->capsmall, v->nsmall + 1, sizeof(int64_t))) return;
    size_t i = v->nsmall++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (v->small[up] <= x) break;
        v->small[i] = v->small[up];
        i = up;
    }
    v->small[i] = x;
}

static int64_t heap_pop(VA *v) {
    int64_t top = v->small[0], x = v->small[--v->nsmall];
    size_t i = 0, n = v->nsmall;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && v->small[c + 1] < v->small[c]) c++;
        if (x <= v->small[c]) break;
        v->small[i] = v->small[c];
        i = c;
    }
    if (n) v->small[i] = x;
    return top;
}

/* DriverVA.alloc */
static int64_t va_alloc(A *a, VA *v, int64_t size) {
    if (size == SMALL_BUFFER) {
        if (v->nsmall) return heap_pop(v);
        int64_t addr = v->small_next;
        v->small_next += size;
        return addr;
    }
    size_t lo = 0, hi = v->nholes; /* bisect_left((size, -1)) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        Hole *h = &v->holes[mid];
        if (h->size < size || (h->size == size && h->addr < -1))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < v->nholes) {
        Hole h = v->holes[lo];
        memmove(&v->holes[lo], &v->holes[lo + 1], (v->nholes - lo - 1) * sizeof(Hole));
        v->nholes--;
        if (h.size > size) hole_add(a, v, h.size - size, h.addr + size);
        return h.addr;
    }
    v->low -= size;
    return v->low;
}

/* DriverVA.free: a freed range merges with the holes next to it, visited in sorted order */
static void va_free(A *a, VA *v, int64_t addr, int64_t size) {
    if (size == SMALL_BUFFER) {
        heap_push(a, v, addr);
        return;
    }
    int64_t start = addr, end = addr + size;
    size_t w = 0;
    for (size_t j = 0; j < v->nholes; j++) {
        Hole h = v->holes[j];
        if (h.addr + h.size == start || h.addr == end) {
            if (h.addr < start) start = h.addr;
            if (h.addr + h.size > end) end = h.addr + h.size;
        } else {
            v->holes[w++] = h;
        }
    }
    v->nholes = w;
    hole_add(a, v, end - start, start);
}

/* RecordedAddresses.alloc */
static int64_t rec_alloc(A *a, Rec *r, int64_t size) {
    size_t k = r->count++;
    if (k < r->table->n) {
        int64_t rsize = r->table->pairs[2 * k], addr = r->table->pairs[2 * k + 1], end = addr + size;
        if (r->diverged_at < 0 && rsize != size) r->diverged_at = (int64_t)k;
        int overlaps = 0;
        for (size_t j = 0; j < r->nlive && !overlaps; j++)
            overlaps = r->live[2 * j] < end && addr < r->live[2 * j] + r->live[2 * j + 1];
        if (!overlaps) {
            if (reserve(a, (void **)&r->live, &r->caplive, 2 * (r->nlive + 1), sizeof(int64_t))) return 0;
            r->live[2 * r->nlive] = addr;
            r->live[2 * r->nlive + 1] = size;
            r->nlive++;
            return addr;
        }
    } else if (r->diverged_at < 0) {
        r->diverged_at = (int64_t)k;
    }
    r->fallbacks += 1;
    return va_alloc(a, &r->fallback, size);
}

/* RecordedAddresses.free */
static void rec_free(A *a, Rec *r, int64_t addr, int64_t size) {
    for (size_t j = 0; j < r->nlive; j++)
        if (r->live[2 * j] == addr) {
            r->nlive--;
            r->live[2 * j] = r->live[2 * r->nlive];
            r->live[2 * j + 1] = r->live[2 * r->nlive + 1];
            return;
        }
    va_free(a, &r->fallback, addr, size);
}

static int64_t seg_alloc_addr(A *a, int64_t size) {
    if (a->seg_kind == ADDR_REC) return rec_alloc(a, &a->rec, size);
    if (a->seg_kind == ADDR_VA) return va_alloc(a, &a->seg_va, size);
    return call_alloc(a, a->addr_alloc, size);
}

static void seg_free_addr(A *a, int64_t addr, int64_t size) {
    if (a->seg_kind == ADDR_REC)
        rec_free(a, &a->rec, addr, size);
    else if (a->seg_kind == ADDR_VA)
        va_free(a, &a->seg_va, addr, size);
    else
        call_free(a, a->addr_free, addr, size);
}

static int64_t va_reserve(A *a, int64_t size) {
    return a->va_kind == ADDR_VA ? va_alloc(a, &a->va, size) : call_alloc(a, a->va_alloc, size);
}

static void va_release(A *a, int64_t addr, int64_t size) {
    if (a->va_kind == ADDR_VA)
        va_free(a, &a->va, addr, size);
    else
        call_free(a, a->va_free, addr, size);
}

/* ------------------------------------------------------------------ sizes */
#if defined(_MSC_VER)
#include <intrin.h>
static inline int bitlen(int64_t x) {
    unsigned long i;
    if (x <= 0) return 0;
    _BitScanReverse64(&i, (unsigned __int64)x);
    return (int)i + 1;
}
#else
static inline int bitlen(int64_t x) { return x <= 0 ? 0 : 64 - __builtin_clzll((unsigned long long)x); }
#endif

static int64_t next_division(int64_t size, int64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    int64_t floor = (int64_t)1 << (bitlen(size) - 1);
    int64_t step = floor >> (bitlen(divisions) - 1);
    if (step == 0) return floor << 1;
    int64_t f = size & ~(step - 1);
    return f == size ? size : f + step;
}

static inline int64_t round_size(A *a, int64_t size) {
    if (size < MIN_BLOCK) return MIN_BLOCK;
    if (a->has_table) {
        int idx = bitlen(size) - 21;
        int64_t d = a->table[idx < 0 ? 0 : (idx > 15 ? 15 : idx)];
        if (d > 1 && size > MIN_BLOCK * d) return next_division(size, d);
    }
    return (size + 511) & ~(int64_t)511;
}

static inline int64_t allocation_size(A *a, int64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (size < MIN_LARGE_ALLOC) return a->mid_segment;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* ------------------------------------------------------------------ segments */
static Seg *seg_new(A *a, int64_t addr, int64_t size, int64_t stream, int small, int es, int64_t page) {
    Seg *s = malloc(sizeof(Seg));
    if (!s || push_ptr((void ***)&a->segs, &a->nsegs, &a->capsegs, s)) {
        free(s);
        a->error = ERR_NOMEM;
        return NULL;
    }
    s->addr = addr;
    s->size = size;
    s->stream = stream;
    s->small = small;
    s->id = a->next_seg_id++;
    s->es = es;
    s->es_page = page;
    s->head = NULL;
    s->idx = a->nsegs - 1;
    return s;
}

static void seg_del(A *a, Seg *s) {
    Seg *last = a->segs[--a->nsegs];
    a->segs[s->idx] = last;
    last->idx = s->idx;
    free(s);
}

static int64_t largest_free_block(A *a) {
    int64_t best = 0;
    Pool *pools[2] = {&a->large_pool, &a->small_pool};
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < pools[p]->nsets; i++) {
            Blk *m = t_max(pools[p]->sets[i].root);
            if (m && m->size > best) best = m->size;
        }
    return best;
}

static void release_block(A *a, Pool *pool, Blk *b) {
    Seg *seg = b->seg;
    Stats *st = &a->st;
    st->num_device_free += 1;
    event(a, EV_SEG_FREE, b->addr, b->size, seg->stream);
    a->used -= b->size;
    seg_free_addr(a, b->addr, b->size);
    st->segments -= 1;
    st->reserved -= b->size;
    if (a->has_mss && b->size >= a->mss) st->oversize_segments -= 1;
    fs_remove(pool, b);
    blk_del(a, b);
    seg_del(a, seg);
}

/* ------------------------------------------------------------------ expandable segments */
static void merge_into(Pool *pool, A *a, Blk *dst, Blk *src) {
    if (!src || src->allocated || src->mapped != dst->mapped) return;
    if (dst->prev == src) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (src->prev)
            src->prev->next = dst;
        else
            dst->seg->head = dst;
    } else {
        dst->next = src->next;
        if (src->next) src->next->prev = dst;
    }
    dst->size += src->size;
    if (src->mapped)
        fs_remove(pool, src);
    else
        um_remove(pool, src);
    blk_del(a, src);
}

static Blk *find_expandable_block(A *a, Pool *pool, int64_t size, int64_t stream) {
    FSet *um = set_find(pool->um, pool->num, stream);
    if (um) {
        for (Blk *c0 = t_min(um->root); c0; c0 = t_succ(um->root, c0)) {
            Blk *c = c0, *p = c0->prev;
            if (p && !p->allocated) c = p;
            int64_t got = 0;
            Blk *x = c;
            while (got < size && x && !x->allocated) {
                got += x->size;
                x = x->next;
            }
            if (got >= size) return c;
        }
    }
    int64_t page = pool->small ? SMALL_BUFFER : a->mid_segment;
    int64_t t = a->total;
    int64_t want = t + t / 8;
    int64_t max_pages = (want + page - 1) / page;
    int64_t vsize = page * max_pages;
    int64_t base = va_reserve(a, vsize);
    if (a->error) return NULL;
    Seg *seg = seg_new(a, base, vsize, stream, pool->small, 1, page);
    if (!seg) return NULL;
    Blk *b = blk_new(a, base, vsize, seg, 0);
    if (!b) return NULL;
    seg->head = b;
    um_add(a, pool, b);
    return b;
}

static int map_block(A *a, Pool *pool, Blk *b, int64_t size) {
    Seg *seg = b->seg;
    int64_t page = seg->es_page, start = b->addr;
    int64_t begin = (start - seg->addr) / page;
    int64_t end = (start + size - seg->addr + page - 1) / page;
    if (end <= begin) return 0;
    int64_t mapped = (end - begin) * page;
    if (a->used + mapped > a->usable) return 0; /* cuMemCreate fails */
    a->used += mapped;
    um_remove(pool, b);
    b->mapped = 1;
    if (mapped < b->size) {
        Blk *rest = blk_new(a, b->addr + mapped, b->size - mapped, seg, 0);
        if (!rest) return 0;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        um_add(a, pool, rest);
        b->size = mapped;
    }
    merge_into(pool, a, b, b->prev);
    merge_into(pool, a, b, b->next);
    fs_insert(a, pool, b);
    st_reserved_inc(&a->st, mapped);
    a->st.num_device_alloc += 1;
    event(a, EV_SEG_MAP, start, mapped, seg->stream);
    return 1;
}

static Blk *try_allocate_expandable(A *a, Pool *pool, int64_t size, int64_t stream) {
    Blk *c = find_expandable_block(a, pool, size, stream);
    if (!c) return NULL;
    if (!c->mapped && !map_block(a, pool, c, c->size < size ? c->size : size)) return NULL;
    while (!a->error && c->size < size) {
        Blk *nxt = c->next;
        int64_t want = size - c->size;
        if (!map_block(a, pool, nxt, want < nxt->size ? want : nxt->size)) return NULL;
        c = nxt;
    }
    if (a->error) return NULL;
    fs_remove(pool, c);
    return c;
}

static void unmap_block(A *a, Pool *pool, Blk *b) {
    Seg *seg = b->seg;
    int64_t page = seg->es_page;
    int64_t begin = (b->addr - seg->addr + page - 1) / page;
    int64_t end = (b->addr + b->size - seg->addr) / page;
    if (begin >= end) return;
    int64_t length = (end - begin) * page;
    a->used -= length;
    int64_t start = seg->addr + begin * page;
    fs_remove(pool, b);
    int64_t before = start - b->addr;
    if (before > 0) {
        Blk *bf = blk_new(a, b->addr, before, seg, 1);
        if (!bf) return;
        bf->prev = b->prev;
        bf->next = b;
        if (b->prev)
            b->prev->next = bf;
        else
            seg->head = bf;
        b->prev = bf;
        fs_insert(a, pool, bf);
    }
    int64_t after = b->size - before - length;
    if (after > 0) {
        Blk *af = blk_new(a, start + length, after, seg, 1);
        if (!af) return;
        af->prev = b;
        af->next = b->next;
        if (b->next) b->next->prev = af;
        b->next = af;
        fs_insert(a, pool, af);
    }
    b->addr = start;
    b->size = length;
    b->mapped = 0;
    merge_into(pool, a, b, b->prev);
    merge_into(pool, a, b, b->next);
    um_add(a, pool, b);
    a->st.reserved -= length;
    a->st.num_device_free += 1;
    event(a, EV_SEG_UNMAP, start, length, seg->stream);
}

static void release_expandable_segment(A *a, Pool *pool, Blk *b) {
    Seg *seg = b->seg;
    um_remove(pool, b);
    va_release(a, seg->addr, seg->size);
    blk_del(a, b);
    seg_del(a, seg);
}

/* ------------------------------------------------------------------ slow path */
static void release_cached(A *a) {
    a->st.num_sync_all_streams += 1;
    Pool *pools[2] = {&a->large_pool, &a->small_pool};
    for (int p = 0; p < 2 && !a->error; p++) {
        Pool *pool = pools[p];
        Blk **to_unmap = NULL;
        size_t nu = 0, cu = 0;
        for (int s = 0; s < pool->nsets && !a->error; s++) {
            FSet *fs = &pool->sets[s];
            Blk *b = t_min(fs->root);
            while (b && !a->error) {
                Blk *nx = t_succ(fs->root, b);
                if (b->seg->es) {
                    if (push_ptr((void ***)&to_unmap, &nu, &cu, b)) {
                        a->error = ERR_NOMEM;
                    }
                } else if (!b->prev && !b->next) {
                    release_block(a, pool, b);
                }
                b = nx;
            }
        }
        for (size_t k = 0; k < nu && !a->error; k++) {
            Blk *b = to_unmap[k];
            unmap_block(a, pool, b);
            if (!b->mapped && !b->prev && !b->next) release_expandable_segment(a, pool, b);
        }
        free(to_unmap);
    }
}

static int release_available(A *a, Pool *pool, int64_t size, int64_t stream) {
    if (!a->has_mss) return 0;
    int64_t mss = a->mss;
    FSet *fs = set_find(pool->sets, pool->nsets, stream);
    if (!fs) return 0;
    int64_t need = size > mss ? size : mss;
    Blk *lb = t_lower(fs->root, need, 0, INT64_MIN);
    if (lb && !lb->seg->es) {
        release_block(a, pool, lb);
        return 1;
    }
    Blk *b = lb ? t_pred(fs->root, lb) : t_max(fs->root);
    if (!b) return 0;
    int64_t released = 0;
    while (released < need && !a->error) {
        if (b->size < mss) break;
        Blk *down = t_pred(fs->root, b);
        if (!b->seg->es) {
            released += b->size;
            release_block(a, pool, b);
        }
        if (!down) break;
        b = down;
    }
    return released >= need;
}

static void garbage_collect(A *a) {
    int64_t threshold = (int64_t)(a->gc_threshold * (double)a->cap);
    Stats *st = &a->st;
    if (st->reserved <= threshold) return;
    int64_t target = st->reserved - threshold;
    Pool *pool = &a->large_pool;
    int64_t calls = pool->calls;
    int64_t total_age = 0, count = 0;
    for (int s = 0; s < pool->nsets; s++)
        for (Blk *b = t_min(pool->sets[s].root); b; b = t_succ(pool->sets[s].root, b))
            if (!b->prev && !b->next) {
                total_age += calls - b->gc_base;
                count++;
            }
    if (count == 0) return;
    int64_t reclaimed = 0;
    int freed = 1;
    while (reclaimed < target && freed && count > 0 && !a->error) {
        double avg = (double)total_age / (double)count;
        freed = 0;
        for (int s = 0; s < pool->nsets && !a->error; s++) {
            FSet *fs = &pool->sets[s];
            Blk *b = t_min(fs->root);
            while (b && !a->error) {
                Blk *nx = t_succ(fs->root, b);
                if (!b->prev && !b->next && !b->seg->es) {
                    int64_t age = calls - b->gc_base;
                    if ((double)age >= avg) {
                        freed = 1;
                        reclaimed += b->size;
                        total_age -= age;
                        count--;
                        release_block(a, pool, b);
                    }
                }
                b = nx;
            }
        }
    }
}

static Blk *alloc_block(A *a, Pool *pool, int64_t size, int64_t alloc_size, int64_t stream, int small,
                        int retry) {
    Stats *st = &a->st;
    if (retry) st->num_alloc_retries += 1;
    int64_t want = st->reserved + alloc_size;
    if (a->has_cap && want > a->cap) {
        a->diverged = 1;
        return NULL;
    }
    if (want > a->vmax) a->vmax = want;
    if (a->expandable) return try_allocate_expandable(a, pool, size, stream);
    if (a->used + alloc_size > a->usable) return NULL; /* cudaMalloc fails */
    a->used += alloc_size;
    int64_t addr = seg_alloc_addr(a, alloc_size);
    if (a->error) return NULL;
    Seg *seg = seg_new(a, addr, alloc_size, stream, small, 0, 0);
    if (!seg) return NULL;
    Blk *b = blk_new(a, addr, alloc_size, seg, 1);
    if (!b) return NULL;
    seg->head = b;
    st->segments += 1;
    st->segments_cum += 1;
    if (st->segments > st->segments_peak) st->segments_peak = st->segments;
    st_reserved_inc(st, alloc_size);
    if (a->has_mss && alloc_size >= a->mss) {
        st->oversize_segments += 1;
        st->oversize_segments_cum += 1;
        if (st->oversize_segments > st->oversize_segments_peak) st->oversize_segments_peak = st->oversize_segments;
    }
    st->num_device_alloc += 1;
    event(a, EV_SEG_ALLOC, addr, alloc_size, stream);
    return b;
}

static Blk *malloc_slow(A *a, Pool *pool, int64_t orig, int64_t size, int64_t stream, int small) {
    int64_t alloc_size = allocation_size(a, size);
    if (a->gc_on) garbage_collect(a);
    if (a->error) return NULL;
    Blk *b = alloc_block(a, pool, size, alloc_size, stream, small, 0);
    if (a->error) return NULL;
    if (!b && release_available(a, pool, size, stream)) b = alloc_block(a, pool, size, alloc_size, stream, small, 0);
    if (a->error) return NULL;
    if (!b) {
        release_cached(a);
        if (a->error) return NULL;
        b = alloc_block(a, pool, size, alloc_size, stream, small, 1);
        if (a->error) return NULL;
    }
    if (!b) {
        Stats *st = &a->st;
        st->num_ooms += 1;
        a->has_oom = 1;
        a->oom.request_index = a->request_index;
        a->oom.size = orig;
        a->oom.rounded = size;
        a->oom.alloc_size = alloc_size;
        a->oom.stream = stream;
        a->oom.reserved = st->reserved;
        a->oom.allocated = st->allocated;
        a->oom.device_free = a->total - a->overhead - a->used;
        a->oom.largest = largest_free_block(a);
        event(a, EV_OOM, 0, size, stream);
    }
    return b;
}

/* ------------------------------------------------------------------ get_free_block */
static Blk *get_free_block(A *a, Pool *pool, int64_t size, int64_t stream) {
    if (a->gc_on) pool->calls += 1;
    FSet *fs = set_find(pool->sets, pool->nsets, stream);
    if (!fs) return NULL;
    Blk *b = t_lower(fs->root, size, 0, INT64_MIN);
    if (!b) return NULL;
    if (b->seg->es) {
        if (a->expandable) {
            Blk *nxt = b->next;
            int64_t ex = b->size + (nxt && !nxt->mapped ? nxt->size : 0);
            Blk *c = t_succ(fs->root, b);
            while (b->seg->es && c) {
                Blk *cn = c->next;
                int64_t cex = c->size + (cn && !cn->mapped ? cn->size : 0);
                if (cex >= ex) break;
                b = c;
                ex = cex;
                c = t_succ(fs->root, c);
            }
        } else {
            b = t_succ(fs->root, b);
            while (b && b->seg->es) b = t_succ(fs->root, b);
            if (!b) return NULL;
        }
    }
    if (a->has_mss) {
        if (size < a->mss && b->size >= a->mss) return NULL;
        if (size >= a->mss && b->size >= size + a->nsr) return NULL;
    }
    t_remove(&fs->root, b);
    return b;
}

/* ------------------------------------------------------------------ malloc / free */
static Blk *sim_malloc(A *a, int64_t orig, int64_t stream) {
    int64_t size = round_size(a, orig);
    int small = size <= SMALL_SIZE;
    Pool *pool = small ? &a->small_pool : &a->large_pool;
    Blk *b = get_free_block(a, pool, size, stream);
    if (!b) {
        b = malloc_slow(a, pool, orig, size, stream, small);
        if (!b) return NULL;
    }
    int64_t remaining = b->size - size;
    Stats *st = &a->st;
    int es = b->seg->es;
    int split = (small || a->expandable) ? remaining >= MIN_BLOCK
                                         : (remaining > SMALL_SIZE && (!a->has_mss || size < a->mss));
    if (split) {
        int was_split = b->prev || b->next;
        Blk *nb = blk_new(a, b->addr, size, b->seg, 1);
        if (!nb) return NULL;
        nb->prev = b->prev;
        nb->next = b;
        if (b->prev)
            b->prev->next = nb;
        else
            b->seg->head = nb;
        b->prev = nb;
        b->addr += size;
        b->size = remaining;
        fs_insert(a, pool, b);
        if (!es) {
            if (was_split)
                st_inactive_change(st, 0, -size);
            else
                st_inactive_change(st, 1, remaining);
        }
        b = nb;
    } else if (!es && (b->prev || b->next)) {
        st_inactive_change(st, -1, -b->size);
    }
    b->allocated = 1;
    b->requested = orig;
    int64_t bs = b->size;
    st->alloc_count += 1;
    st->alloc_cum += 1;
    if (st->alloc_count > st->alloc_peak) st->alloc_peak = st->alloc_count;
    st->allocated += bs;
    st->allocated_cum += bs;
    if (st->allocated > st->allocated_peak) st->allocated_peak = st->allocated;
    st->requested += orig;
    st->requested_cum += orig;
    if (st->requested > st->requested_peak) st->requested_peak = st->requested;
    if (a->has_mss && bs >= a->mss) {
        st->oversize_allocations += 1;
        st->oversize_allocations_cum += 1;
        if (st->oversize_allocations > st->oversize_allocations_peak)
            st->oversize_allocations_peak = st->oversize_allocations;
    }
    return b;
}

static void sim_free(A *a, Blk *b) {
    Stats *st = &a->st;
    int64_t bs = b->size;
    st->alloc_count -= 1;
    st->allocated -= bs;
    st->requested -= b->requested;
    if (a->has_mss && bs >= a->mss) st->oversize_allocations -= 1;
    b->allocated = 0;
    Seg *seg = b->seg;
    Pool *pool = seg->small ? &a->small_pool : &a->large_pool;
    int64_t net_n = 0, net_bytes = 0;
    Blk *p = b->prev;
    if (p && !p->allocated && p->mapped) {
        fs_remove(pool, p);
        b->addr = p->addr;
        b->size += p->size;
        b->prev = p->prev;
        if (p->prev)
            p->prev->next = b;
        else
            seg->head = b;
        net_n -= 1;
        net_bytes -= p->size;
        blk_del(a, p);
    }
    Blk *n = b->next;
    if (n && !n->allocated && n->mapped) {
        fs_remove(pool, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        net_n -= 1;
        net_bytes -= n->size;
        blk_del(a, n);
    }
    fs_insert(a, pool, b);
    if (!seg->es) {
        if (b->prev || b->next) {
            net_n += 1;
            net_bytes += b->size;
        }
        st_inactive_change(st, net_n, net_bytes);
    }
}

/* ------------------------------------------------------------------ live table (rid -> block) */
/* Open addressing with linear probing. A request id's home slot is the id itself (modulo the size):
 * a program's ids count up and most are freed soon after they are made, so the ids in use cluster
 * and their slots share warm cache lines (a mixed hash sends each to a cold line, which costs a replay
 * of a million requests ~35 % more time). Ids that pile up (a long run of ids kept live, then ids a table size later landing on it)
 * make long probe runs; the first run longer than LIVE_PROBES switches the table to a mixed hash for
 * good. Which slot holds an id never changes what the table answers. */
#define LIVE_PROBES 64

typedef struct {
    LiveSlot *slots;
    size_t mask, n;
    int mixed; /* home slots from a mix of the id (after a long probe run) */
} Live;

static inline size_t live_home(const Live *t, int64_t k) {
    uint64_t x = (uint64_t)k;
    if (t->mixed) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
    }
    return (size_t)x & t->mask;
}

static int live_init(Live *t, size_t hint) {
    size_t cap = 1024;
    while (cap < hint * 2) cap <<= 1;
    t->slots = malloc(cap * sizeof(LiveSlot));
    if (!t->slots) return -1;
    for (size_t i = 0; i < cap; i++) t->slots[i].b = NULL;
    t->mask = cap - 1;
    t->n = 0;
    return 0;
}

static int live_put(Live *t, int64_t key, Blk *b);

/* every entry into a fresh table of at least `cap` slots (the mode as set) */
static int live_rebuild(Live *t, size_t cap) {
    LiveSlot *old = t->slots;
    size_t oldcap = t->mask + 1, oldn = t->n;
    if (live_init(t, cap / 2)) {
        t->slots = old;
        t->n = oldn;
        t->mask = oldcap - 1;
        return -1;
    }
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].b) live_put(t, old[i].key, old[i].b);
    free(old);
    return 0;
}

static int live_put(Live *t, int64_t key, Blk *b) {
    if ((t->n + 1) * 2 > t->mask + 1 && live_rebuild(t, 2 * (t->mask + 1))) return -1;
    size_t i = live_home(t, key), probes = 0;
    while (t->slots[i].b) {
        if (t->slots[i].key == key) {
            t->slots[i].b = b; /* an id reused while live: the old block stays allocated (leaks), as in Python */
            return 0;
        }
        i = (i + 1) & t->mask;
        if (++probes > LIVE_PROBES && !t->mixed) {
            t->mixed = 1;
            if (live_rebuild(t, t->mask + 1)) {
                t->mixed = 0; /* the table is as it was */
                return -1;
            }
            return live_put(t, key, b);
        }
    }
    t->slots[i].key = key;
    t->slots[i].b = b;
    t->n++;
    return 0;
}

static Blk *live_pop(Live *t, int64_t key) {
    size_t i = live_home(t, key), probes = 0;
    while (t->slots[i].b) {
        if (t->slots[i].key == key) break;
        i = (i + 1) & t->mask;
        probes++;
    }
    Blk *b = t->slots[i].b;
    if (!b) return NULL;
    /* backward-shift deletion keeps probe chains intact */
    size_t j = i;
    for (;;) {
        t->slots[i].b = NULL;
        for (;;) {
            j = (j + 1) & t->mask;
            probes++;
            if (!t->slots[j].b) {
                t->n--;
                /* a long run: switch to the mixed hash (the entries stay; only their slots move) */
                if (probes > LIVE_PROBES && !t->mixed) {
                    t->mixed = 1;
                    if (live_rebuild(t, t->mask + 1)) t->mixed = 0; /* no memory: keep probing */
                }
                return b;
            }
            size_t h = live_home(t, t->slots[j].key);
            /* can slot j's entry move to i? only if its home h is not in (i, j] cyclically */
            if (i <= j ? (h <= i || h > j) : (h <= i && h > j)) break;
        }
        t->slots[i] = t->slots[j];
        i = j;
    }
}

/* ------------------------------------------------------------------ module entry */
static void rec_table_drop(RecTable *t) {
    if (t && --t->refs == 0) free(t);
}

static void a_free(A *a) {
    for (size_t i = 0; i < a->nchunks; i++) free(a->chunks[i]);
    free(a->chunks);
    for (size_t i = 0; i < a->nsegs; i++) free(a->segs[i]);
    free(a->segs);
    free(a->small_pool.sets);
    free(a->large_pool.sets);
    free(a->small_pool.um);
    free(a->large_pool.um);
    free(a->events);
    free(a->seg_va.holes);
    free(a->seg_va.small);
    free(a->va.holes);
    free(a->va.small);
    free(a->rec.live);
    free(a->rec.fallback.holes);
    free(a->rec.fallback.small);
    rec_table_drop(a->rec.table);
    Py_XDECREF(a->addr_alloc);
    Py_XDECREF(a->addr_free);
    Py_XDECREF(a->va_alloc);
    Py_XDECREF(a->va_free);
    memset(a, 0, sizeof(A));
}

static PyObject *oom_tuple(A *a, const OOM *o) {
    PyObject *cap = a->has_cap ? PyLong_FromLongLong(a->cap) : (Py_INCREF(Py_None), Py_None);
    if (!cap) return NULL;
    return Py_BuildValue("(LLLLLLLLNL)", (long long)o->request_index, (long long)o->size, (long long)o->rounded,
                         (long long)o->alloc_size, (long long)o->stream, (long long)o->reserved,
                         (long long)o->allocated, (long long)o->device_free, cap, (long long)o->largest);
}

static int get_i64_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    if (view->itemsize != 8 || !view->format || (strcmp(view->format, "q") != 0 && strcmp(view->format, "l") != 0) ||
        (n >= 0 && view->len / 8 != n)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a buffer of %zd int64 values", name, n);
        return -1;
    }
    return 0;
}

/* a growing array of int64 (request indices, timeline values) */
typedef struct {
    int64_t *v;
    size_t n, cap;
} Vec;

/* -1 when memory ran out (no Python exception: it may run without the GIL) */
static int vec_push(Vec *x, int64_t val) {
    if (x->n == x->cap) {
        size_t nc = x->cap ? x->cap * 2 : 16;
        int64_t *nv = realloc(x->v, nc * sizeof(int64_t));
        if (!nv) return -1;
        x->v = nv;
        x->cap = nc;
    }
    x->v[x->n++] = val;
    return 0;
}

/* -1 when memory ran out (no Python exception: clones are made without the GIL) */
static int copy_array(void **dst, const void *src, size_t n, size_t elem) {
    *dst = NULL;
    if (!n) return 0;
    *dst = malloc(n * elem);
    if (!*dst) return -1;
    memcpy(*dst, src, n * elem);
    return 0;
}

static int vec_copy(Vec *dst, const Vec *src) {
    dst->n = dst->cap = src->n;
    return copy_array((void **)&dst->v, src->v, src->n, sizeof(int64_t));
}

/* the values, and `last` after them when `with_last` */
static PyObject *vec_list(const Vec *x, int with_last, int64_t last) {
    PyObject *list = PyList_New((Py_ssize_t)(x->n + (with_last ? 1 : 0)));
    if (!list) return NULL;
    for (size_t k = 0; k <= x->n; k++) {
        if (k == x->n && !with_last) break;
        PyObject *o = PyLong_FromLongLong((long long)(k < x->n ? x->v[k] : last));
        if (!o) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, o);
    }
    return list;
}

typedef struct {
    PyObject_HEAD
    A a;
    Live live;                   /* rid -> the block the program holds */
    PyObject *cols[4];           /* ops, sizes, rids, streams (int64 buffers) */
    Py_buffer views[4];
    int nviews;
    const int64_t *ops, *sizes, *rids, *streams;
    Py_ssize_t n;
    PyObject *fallbacks;         /* {request index: fallback sizes} */
    int stop_at_oom, failed, broken, busy, has_result_oom;
    Py_ssize_t step, pos, done, next_mark;
    int64_t bucket_max;
    OOM result_oom;              /* the last failed ALLOC (after its fallbacks) */
    Vec expected, surprises, adapted, t_index, t_alloc;
    OOM *fails;                  /* the allocator state at each expected failure */
    size_t nfails, capfails;
} Session;

static PyTypeObject SessionType;

static void session_dealloc(Session *s) {
    a_free(&s->a);
    free(s->live.slots);
    for (int k = 0; k < s->nviews; k++) PyBuffer_Release(&s->views[k]);
    for (int k = 0; k < 4; k++) Py_XDECREF(s->cols[k]);
    Py_XDECREF(s->fallbacks);
    free(s->expected.v);
    free(s->surprises.v);
    free(s->adapted.v);
    free(s->t_index.v);
    free(s->t_alloc.v);
    free(s->fails);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Session *session_alloc(void) {
    Session *s = PyObject_New(Session, &SessionType);
    if (!s) return NULL;
    memset((char *)s + sizeof(PyObject), 0, sizeof(Session) - sizeof(PyObject));
    return s;
}

static int session_views(Session *s, PyObject *const cols[4], Py_ssize_t n) {
    static const char *names[4] = {"ops", "sizes", "rids", "streams"};
    for (int k = 0; k < 4; k++) {
        if (get_i64_buffer(cols[k], &s->views[k], n, names[k])) return -1;
        s->nviews = k + 1;
        Py_INCREF(cols[k]);
        s->cols[k] = cols[k];
    }
    s->ops = s->views[0].buf;
    s->sizes = s->views[1].buf;
    s->rids = s->views[2].buf;
    s->streams = s->views[3].buf;
    s->n = n;
    return 0;
}

/* ("py", alloc, free) | ("va", top, small_region) | ("recorded", pairs, top, small_region) */
static int parse_addresses(A *a, PyObject *spec, int for_va) {
    const char *kind;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0)) ||
        !(kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0)))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "an address spec is a tuple naming its kind");
        return -1;
    }
    long long top, region;
    if (strcmp(kind, "py") == 0) {
        PyObject *fa, *ff;
        if (!PyArg_ParseTuple(spec, "sOO", &kind, &fa, &ff)) return -1;
        Py_INCREF(fa);
        Py_INCREF(ff);
        if (for_va) {
            a->va_kind = ADDR_PY;
            a->va_alloc = fa;
            a->va_free = ff;
        } else {
            a->seg_kind = ADDR_PY;
            a->addr_alloc = fa;
            a->addr_free = ff;
        }
        return 0;
    }
    if (strcmp(kind, "va") == 0) {
        if (!PyArg_ParseTuple(spec, "sLL", &kind, &top, &region)) return -1;
        if (for_va) {
            a->va_kind = ADDR_VA;
            va_init(&a->va, top, region);
        } else {
            a->seg_kind = ADDR_VA;
            va_init(&a->seg_va, top, region);
        }
        return 0;
    }
    if (strcmp(kind, "recorded") == 0 && !for_va) {
        PyObject *pairs;
        if (!PyArg_ParseTuple(spec, "sOLL", &kind, &pairs, &top, &region)) return -1;
        Py_buffer view;
        if (get_i64_buffer(pairs, &view, -1, "recorded pairs")) return -1;
        size_t n = (size_t)(view.len / 16);
        RecTable *t = malloc(sizeof(RecTable) + 2 * n * sizeof(int64_t) + 1);
        if (!t) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            return -1;
        }
        t->refs = 1;
        t->n = n;
        t->pairs = (int64_t *)(t + 1);
        if (n) memcpy(t->pairs, view.buf, 2 * n * sizeof(int64_t));
        PyBuffer_Release(&view);
        a->seg_kind = ADDR_REC;
        a->rec.table = t;
        a->rec.diverged_at = -1;
        va_init(&a->rec.fallback, top, region);
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "unknown address spec kind %s", kind);
    return -1;
}

static int parse_settings(A *a, PyObject *settings) {
    PyObject *o_cap, *o_mss, *o_table;
    long long nsr, mid;
    int expandable, id_key;
    if (!PyArg_ParseTuple(settings, "OdOLLpOp", &o_cap, &a->gc_threshold, &o_mss, &nsr, &mid, &expandable, &o_table,
                          &id_key))
        return -1;
    a->nsr = nsr;
    a->mid_segment = mid;
    a->expandable = expandable;
    a->id_key = id_key;
    if (o_cap != Py_None) {
        a->has_cap = 1;
        a->cap = PyLong_AsLongLong(o_cap);
        if (a->cap == -1 && PyErr_Occurred()) return -1;
    }
    a->gc_on = a->has_cap && a->gc_threshold > 0;
    if (o_mss != Py_None) {
        a->has_mss = 1;
        a->mss = PyLong_AsLongLong(o_mss);
        if (a->mss == -1 && PyErr_Occurred()) return -1;
    }
    if (o_table != Py_None) {
        if (!PyTuple_Check(o_table) || PyTuple_GET_SIZE(o_table) != 16) {
            PyErr_SetString(PyExc_ValueError, "table must be a tuple of 16 ints or None");
            return -1;
        }
        a->has_table = 1;
        for (int i = 0; i < 16; i++) {
            a->table[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o_table, i));
            if (a->table[i] == -1 && PyErr_Occurred()) return -1;
        }
    }
    return 0;
}

static const char session_doc[] =
    "session(ops, sizes, rids, streams, fallbacks, settings, device, addresses, flags) -> Session\n\n"
    "A replay of replay.py's request loop, paused before request 0. ops/sizes/rids/streams: int64\n"
    "buffers of equal length; fallbacks: {request index: tuple of sizes}; settings: (cap|None,\n"
    "gc_threshold, mss|None, nsr, mid_segment, expandable, table|None, id_key); device: (total,\n"
    "overhead); addresses: (segments, reservations), each ('py', alloc, free) or ('va', top,\n"
    "small_region), segments also ('recorded', int64 (size, addr) pairs, fallback top, fallback\n"
    "small_region); flags: (record_events, stop_at_oom, step).";

static PyObject *py_session(PyObject *self, PyObject *args) {
    PyObject *cols[4], *fallbacks, *settings, *device, *addresses, *flags;
    if (!PyArg_ParseTuple(args, "OOOOO!O!O!O!O!", &cols[0], &cols[1], &cols[2], &cols[3], &PyDict_Type, &fallbacks,
                          &PyTuple_Type, &settings, &PyTuple_Type, &device, &PyTuple_Type, &addresses, &PyTuple_Type,
                          &flags))
        return NULL;
    Session *s = session_alloc();
    if (!s) return NULL;
    A *a = &s->a;
    a->rng = 2463534242u;
    a->small_pool.small = 1;
    long long total, overhead;
    int record_events;
    PyObject *seg_spec, *va_spec;
    if (parse_settings(a, settings) || !PyArg_ParseTuple(device, "LL", &total, &overhead) ||
        !PyArg_ParseTuple(addresses, "OO", &seg_spec, &va_spec) || parse_addresses(a, seg_spec, 0) ||
        parse_addresses(a, va_spec, 1) ||
        !PyArg_ParseTuple(flags, "ppn", &record_events, &s->stop_at_oom, &s->step))
        goto fail;
    a->total = total;
    a->overhead = overhead;
    a->usable = total - overhead;
    a->record_events = record_events;
    if (s->step < 1) s->step = 1;
    Py_ssize_t n = PyObject_Length(cols[0]);
    if (n < 0 || session_views(s, cols, n)) goto fail;
    if (live_init(&s->live, 1024)) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_INCREF(fallbacks);
    s->fallbacks = fallbacks;
    s->done = n;
    s->next_mark = s->step;
    return (PyObject *)s;
fail:
    Py_DECREF(s);
    return NULL;
}

static int push_fail(Session *s) {
    if (s->nfails == s->capfails) {
        size_t nc = s->capfails ? s->capfails * 2 : 16;
        OOM *nf = realloc(s->fails, nc * sizeof(OOM));
        if (!nf) return -1;
        s->fails = nf;
        s->capfails = nc;
    }
    s->fails[s->nfails++] = s->a.oom;
    return 0;
}

/* a failed ALLOC asks for its fallback sizes in order (replay._fall_back) */
static Blk *fall_back(Session *s, Py_ssize_t i) {
    A *a = &s->a;
    PyObject *key = PyLong_FromSsize_t(i);
    if (!key) return NULL;
    PyObject *fb = PyDict_GetItemWithError(s->fallbacks, key);
    Py_DECREF(key);
    if (!fb) return NULL;
    PyObject *seq = PySequence_Fast(fb, "fallbacks must be sequences of sizes");
    if (!seq) return NULL;
    Blk *b = NULL;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq) && !b; k++) {
        long long fs = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
        if (fs == -1 && PyErr_Occurred()) break;
        b = sim_malloc(a, fs, s->streams[i]);
        if (a->error) break;
    }
    Py_DECREF(seq);
    if (b && vec_push(&s->adapted, i)) {
        a->error = ERR_NOMEM;
        return NULL;
    }
    return b;
}

/* requests [pos, stop): PySession.run's loop; -1 on an error (A.error says which). Without
 * `fallbacks` nothing here calls Python: then it runs with the GIL released. */
static int session_run(Session *s, Py_ssize_t stop, int fallbacks) {
    A *a = &s->a;
    Stats *st = &a->st;
    const int64_t *ops = s->ops, *sizes = s->sizes, *rids = s->rids, *streams = s->streams;
    if (stop > s->n) stop = s->n;
    for (Py_ssize_t i = s->pos; i < stop && !s->failed; i++) {
        if (i == s->next_mark) {
            if (vec_push(&s->t_index, i) || vec_push(&s->t_alloc, s->bucket_max)) goto nomem;
            s->bucket_max = st->allocated;
            s->next_mark += s->step;
        }
        int64_t op = ops[i];
        if (op == OP_ALLOC) {
            a->request_index = i;
            Blk *b = sim_malloc(a, sizes[i], streams[i]);
            if (a->error) return -1;
            if (!b && fallbacks) {
                b = fall_back(s, i);
                if (!a->error && PyErr_Occurred()) a->error = ERR_PY;
                if (a->error) return -1;
            }
            if (!b) {
                s->has_result_oom = a->has_oom;
                s->result_oom = a->oom;
                if (s->stop_at_oom) {
                    s->done = i;
                    s->failed = 1;
                    s->pos = i;
                    return 0;
                }
                continue;
            }
            if (live_put(&s->live, rids[i], b)) goto nomem;
            if (st->allocated > s->bucket_max) s->bucket_max = st->allocated;
        } else if (op == OP_FREE) {
            Blk *b = live_pop(&s->live, rids[i]);
            if (b) sim_free(a, b);
        } else if (op == OP_EMPTY_CACHE) {
            a->request_index = i;
            release_cached(a);
            if (a->error) return -1;
        } else if (op == OP_FAILED_ALLOC) {
            a->request_index = i;
            Blk *b = sim_malloc(a, sizes[i], streams[i]);
            if (a->error) return -1;
            if (!b) {
                if (vec_push(&s->expected, i) || push_fail(s)) goto nomem;
            } else {
                if (vec_push(&s->surprises, i)) goto nomem;
                sim_free(a, b);
            }
        }
    }
    if (!s->failed) s->pos = stop > s->pos ? stop : s->pos;
    return 0;
nomem:
    a->error = ERR_NOMEM;
    return -1;
}

/* An error of the allocator as a Python exception (the GIL held); the session is not used again. */
static PyObject *session_fail(Session *s) {
    s->broken = 1;
    if (!PyErr_Occurred()) {
        if (s->a.error == ERR_NOMEM)
            PyErr_NoMemory();
        else
            PyErr_SetString(PyExc_RuntimeError, "replay session failed");
    }
    return NULL;
}

static int session_usable(Session *s) {
    if (s->broken) {
        PyErr_SetString(PyExc_RuntimeError, "this replay session failed earlier (an error in its address model)");
        return 0;
    }
    if (s->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this replay session is running in another thread");
        return 0;
    }
    return 1;
}

static PyObject *session_run_py(Session *s, PyObject *arg) {
    Py_ssize_t stop = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (stop == -1 && PyErr_Occurred()) return NULL;
    if (!session_usable(s)) return NULL;
    int fallbacks = PyDict_GET_SIZE(s->fallbacks) > 0, rc;
    if (fallbacks || s->a.seg_kind == ADDR_PY || s->a.va_kind == ADDR_PY) {
        rc = session_run(s, stop, fallbacks);
    } else {  /* nothing in the loop calls Python: other threads run meanwhile */
        s->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        rc = session_run(s, stop, 0);
        Py_END_ALLOW_THREADS
        s->busy = 0;
    }
    if (rc) return session_fail(s);
    Py_RETURN_NONE;
}

static PyObject *session_empty_cache(Session *s, PyObject *unused) {
    if (!session_usable(s)) return NULL;
    if (!s->failed) {
        s->a.request_index = s->pos;
        release_cached(&s->a);
        if (s->a.error) return session_fail(s);
    }
    Py_RETURN_NONE;
}

static PyObject *session_set_cap(Session *s, PyObject *arg) {
    A *a = &s->a;
    if (!session_usable(s)) return NULL;
    if (arg == Py_None) {
        a->has_cap = 0;
        a->cap = 0;
    } else {
        long long cap = PyLong_AsLongLong(arg);
        if (cap == -1 && PyErr_Occurred()) return NULL;
        a->has_cap = 1;
        a->cap = cap;
    }
    a->gc_on = a->has_cap && a->gc_threshold > 0;
    Py_RETURN_NONE;
}

/* A deep copy of the allocator state into `d` (a zeroed A); the blocks of every segment are
 * copied in one chunk and every pointer between them is mapped through `twin`. */
static int a_clone(A *d, A *src, int events) {
    *d = *src;
    d->free_blks = NULL;
    d->chunks = NULL;
    d->nchunks = d->capchunks = 0;
    d->segs = NULL;
    d->nsegs = d->capsegs = 0;
    d->small_pool.sets = d->large_pool.sets = d->small_pool.um = d->large_pool.um = NULL;
    d->small_pool.capsets = d->small_pool.nsets = d->large_pool.capsets = d->large_pool.nsets = 0;
    d->small_pool.capum = d->small_pool.num = d->large_pool.capum = d->large_pool.num = 0;
    d->events = NULL;
    d->nev = d->capev = 0;
    d->seg_va.holes = d->va.holes = d->rec.fallback.holes = NULL;
    d->seg_va.small = d->va.small = d->rec.fallback.small = NULL;
    d->rec.live = NULL;
    d->rec.table = NULL;

    d->addr_alloc = d->addr_free = d->va_alloc = d->va_free = NULL;
    d->error = 0;
    size_t nblocks = 0;
    for (size_t i = 0; i < src->nsegs; i++)
        for (Blk *b = src->segs[i]->head; b; b = b->next) nblocks++;
    Blk *chunk = NULL;
    if (nblocks) {
        chunk = malloc(nblocks * sizeof(Blk));
        if (!chunk || push_ptr(&d->chunks, &d->nchunks, &d->capchunks, chunk)) {
            free(chunk);
            goto nomem;
        }
    }
    d->segs = malloc((src->nsegs ? src->nsegs : 1) * sizeof(Seg *));
    if (!d->segs) goto nomem;
    d->capsegs = src->nsegs ? src->nsegs : 1;
    size_t k = 0;
    for (size_t i = 0; i < src->nsegs; i++) {
        Seg *os = src->segs[i], *ns = malloc(sizeof(Seg));
        if (!ns) goto nomem;
        *ns = *os;
        ns->idx = i;
        os->twin = ns;
        d->segs[d->nsegs++] = ns;
        for (Blk *b = os->head; b; b = b->next) {
            chunk[k] = *b;
            b->twin = &chunk[k++];
        }
    }
    for (size_t j = 0; j < nblocks; j++) {
        Blk *nb = &chunk[j];
        nb->seg = nb->seg->twin;
        nb->prev = nb->prev ? nb->prev->twin : NULL;
        nb->next = nb->next ? nb->next->twin : NULL;
        nb->l = nb->l ? nb->l->twin : NULL;
        nb->r = nb->r ? nb->r->twin : NULL;
    }
    for (size_t i = 0; i < d->nsegs; i++) d->segs[i]->head = d->segs[i]->head ? d->segs[i]->head->twin : NULL;
    Pool *sp[2] = {&src->small_pool, &src->large_pool}, *dp[2] = {&d->small_pool, &d->large_pool};
    for (int p = 0; p < 2; p++) {
        if (copy_array((void **)&dp[p]->sets, sp[p]->sets, (size_t)sp[p]->nsets, sizeof(FSet)) ||
            copy_array((void **)&dp[p]->um, sp[p]->um, (size_t)sp[p]->num, sizeof(FSet)))
            goto fail;
        dp[p]->nsets = dp[p]->capsets = sp[p]->nsets;
        dp[p]->num = dp[p]->capum = sp[p]->num;
        for (int i = 0; i < dp[p]->nsets; i++)
            dp[p]->sets[i].root = dp[p]->sets[i].root ? dp[p]->sets[i].root->twin : NULL;
        for (int i = 0; i < dp[p]->num; i++)
            dp[p]->um[i].root = dp[p]->um[i].root ? dp[p]->um[i].root->twin : NULL;
    }
    if (events && src->record_events) {
        if (copy_array((void **)&d->events, src->events, src->nev, sizeof(Event))) goto fail;
        d->nev = d->capev = src->nev;
    } else {
        d->record_events = 0;
    }
    VA *sv[3] = {&src->seg_va, &src->va, &src->rec.fallback}, *dv[3] = {&d->seg_va, &d->va, &d->rec.fallback};
    for (int v = 0; v < 3; v++) {
        if (copy_array((void **)&dv[v]->holes, sv[v]->holes, sv[v]->nholes, sizeof(Hole)) ||
            copy_array((void **)&dv[v]->small, sv[v]->small, sv[v]->nsmall, sizeof(int64_t)))
            goto fail;
        dv[v]->capholes = sv[v]->nholes;
        dv[v]->capsmall = sv[v]->nsmall;
    }
    if (copy_array((void **)&d->rec.live, src->rec.live, 2 * src->rec.nlive, sizeof(int64_t))) goto fail;
    d->rec.caplive = 2 * src->rec.nlive;
    d->rec.table = src->rec.table;
    if (d->rec.table) d->rec.table->refs++;
    return 0;
nomem:
fail:
    return -1;
}

static const char clone_doc[] =
    "clone(events=True, fallbacks=None) -> Session: an independent copy of this paused replay (native\n"
    "address models only); events=False leaves the copy without the segment events (it records none\n"
    "either); fallbacks: the copy's {request index: sizes} from now on (default: this replay's).";

/* The allocator and loop state of `s` into the new session `c`: C only, so it runs without the GIL
 * (both sessions marked busy meanwhile: a copy writes `twin` into the source's blocks). */
static int clone_state(Session *c, Session *s, int events) {
    if (a_clone(&c->a, &s->a, events)) return -1;
    c->stop_at_oom = s->stop_at_oom;
    c->failed = s->failed;
    c->has_result_oom = s->has_result_oom;
    c->step = s->step;
    c->pos = s->pos;
    c->done = s->done;
    c->next_mark = s->next_mark;
    c->bucket_max = s->bucket_max;
    c->result_oom = s->result_oom;
    size_t cap = s->live.mask + 1;
    c->live.slots = malloc(cap * sizeof(LiveSlot));
    if (!c->live.slots) return -1;
    c->live.mask = s->live.mask;
    c->live.n = s->live.n;
    c->live.mixed = s->live.mixed;
    for (size_t i = 0; i < cap; i++) {
        c->live.slots[i].key = s->live.slots[i].key;
        c->live.slots[i].b = s->live.slots[i].b ? s->live.slots[i].b->twin : NULL;
    }
    if (vec_copy(&c->expected, &s->expected) || vec_copy(&c->surprises, &s->surprises) ||
        vec_copy(&c->adapted, &s->adapted) || vec_copy(&c->t_index, &s->t_index) ||
        vec_copy(&c->t_alloc, &s->t_alloc) || copy_array((void **)&c->fails, s->fails, s->nfails, sizeof(OOM)))
        return -1;
    c->nfails = c->capfails = s->nfails;
    return 0;
}

static PyObject *session_clone(Session *s, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"events", "fallbacks", NULL};
    int events = 1;
    PyObject *fallbacks = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pO", kwlist, &events, &fallbacks)) return NULL;
    if (fallbacks == Py_None) {
        fallbacks = s->fallbacks;
    } else if (!PyDict_Check(fallbacks)) {
        PyErr_SetString(PyExc_TypeError, "fallbacks must be a dict");
        return NULL;
    }
    if (!session_usable(s)) return NULL;
    if (s->a.seg_kind == ADDR_PY || s->a.va_kind == ADDR_PY) {
        PyErr_SetString(PyExc_ValueError, "only a replay with the native address models can be cloned");
        return NULL;
    }
    Session *c = session_alloc();
    if (!c) return NULL;
    int rc;
    s->busy = c->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = clone_state(c, s, events);
    Py_END_ALLOW_THREADS
    s->busy = c->busy = 0;
    if (rc) {
        PyErr_NoMemory();
        goto fail;
    }
    if (session_views(c, s->cols, s->n)) goto fail;
    Py_INCREF(fallbacks);
    c->fallbacks = fallbacks;
    return (PyObject *)c;
fail:
    Py_DECREF(c);
    return NULL;
}

static const char result_doc[] =
    "result() -> (done, stats, events|None, oom|None, expected, failures, surprises, adapted, t_index,\n"
    "t_alloc), once every request has run or the replay stopped at an OOM (replay._run_native reads it).";

static PyObject *session_result(Session *s, PyObject *unused) {
    A *a = &s->a;
    if (!session_usable(s)) return NULL;
    if (!s->failed && s->pos < s->n) {
        PyErr_SetString(PyExc_ValueError, "the replay has not reached its last request");
        return NULL;
    }
    PyObject *stats = NULL, *events = NULL, *oom = NULL, *expected = NULL, *failures = NULL, *surprises = NULL;
    PyObject *adapted = NULL, *t_index = NULL, *t_alloc = NULL, *result = NULL;
    stats = PyTuple_New(NSTATS);
    if (!stats) goto out;
    int64_t *sv = (int64_t *)&a->st;
    for (int k = 0; k < NSTATS; k++) {
        PyObject *v = PyLong_FromLongLong((long long)sv[k]);
        if (!v) goto out;
        PyTuple_SET_ITEM(stats, k, v);
    }
    if (a->record_events) {
        events = PyList_New((Py_ssize_t)a->nev);
        if (!events) goto out;
        for (size_t k = 0; k < a->nev; k++) {
            Event *e = &a->events[k];
            PyObject *t = Py_BuildValue("(iLLLL)", (int)e->action, (long long)e->addr, (long long)e->size,
                                        (long long)e->stream, (long long)e->ri);
            if (!t) goto out;
            PyList_SET_ITEM(events, (Py_ssize_t)k, t);
        }
    } else {
        Py_INCREF(Py_None);
        events = Py_None;
    }
    if (s->has_result_oom) {
        oom = oom_tuple(a, &s->result_oom);
        if (!oom) goto out;
    } else {
        Py_INCREF(Py_None);
        oom = Py_None;
    }
    failures = PyList_New((Py_ssize_t)s->nfails);
    if (!failures) goto out;
    for (size_t k = 0; k < s->nfails; k++) {
        PyObject *t = oom_tuple(a, &s->fails[k]);
        if (!t) goto out;
        PyList_SET_ITEM(failures, (Py_ssize_t)k, t);
    }
    if (!(expected = vec_list(&s->expected, 0, 0)) || !(surprises = vec_list(&s->surprises, 0, 0)) ||
        !(adapted = vec_list(&s->adapted, 0, 0)) || !(t_index = vec_list(&s->t_index, 1, s->done)) ||
        !(t_alloc = vec_list(&s->t_alloc, 1, s->bucket_max)))
        goto out;
    result = Py_BuildValue("(nOOOOOOOOO)", s->done, stats, events, oom, expected, failures, surprises, adapted,
                           t_index, t_alloc);
out:
    Py_XDECREF(stats);
    Py_XDECREF(events);
    Py_XDECREF(oom);
    Py_XDECREF(expected);
    Py_XDECREF(failures);
    Py_XDECREF(surprises);
    Py_XDECREF(adapted);
    Py_XDECREF(t_index);
    Py_XDECREF(t_alloc);
    return result;
}

static PyObject *get_pos(Session *s, void *c) { return PyLong_FromSsize_t(s->pos); }
static PyObject *get_failed(Session *s, void *c) { return PyBool_FromLong(s->failed); }
static PyObject *get_reserved(Session *s, void *c) { return PyLong_FromLongLong((long long)s->a.st.reserved); }
static PyObject *get_vmax(Session *s, void *c) { return PyLong_FromLongLong((long long)s->a.vmax); }
static PyObject *get_diverged(Session *s, void *c) { return PyBool_FromLong(s->a.diverged); }
static PyObject *get_address_divergence(Session *s, void *c) {
    if (s->a.seg_kind != ADDR_REC || s->a.rec.diverged_at < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)s->a.rec.diverged_at);
}

static PyObject *get_cloneable(Session *s, void *c) {
    return PyBool_FromLong(s->a.seg_kind != ADDR_PY && s->a.va_kind != ADDR_PY);
}

static PyGetSetDef session_getset[] = {
    {"cloneable", (getter)get_cloneable, NULL, "clone() can copy it (its address models are native)", NULL},
    {"pos", (getter)get_pos, NULL, "the next request to run", NULL},
    {"failed", (getter)get_failed, NULL, "the replay stopped at an allocation that failed (stop_at_oom)", NULL},
    {"reserved", (getter)get_reserved, NULL, "reserved bytes now", NULL},
    {"vmax", (getter)get_vmax, NULL, "the largest reserved + segment size any cap comparison passed (0: none)",
     NULL},
    {"diverged", (getter)get_diverged, NULL, "a cap comparison has failed (the run left the uncapped one)", NULL},
    {"address_divergence", (getter)get_address_divergence, NULL,
     "recorded addresses: the first segment whose size differs from the recording's (None: none yet)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef session_methods[] = {
    {"run", (PyCFunction)session_run_py, METH_O, "run(stop): run the requests before index `stop` (and stop at an "
                                                 "OOM when stop_at_oom)"},
    {"empty_cache", (PyCFunction)session_empty_cache, METH_NOARGS, "empty_cache(): an empty_cache() call now"},
    {"set_cap", (PyCFunction)session_set_cap, METH_O, "set_cap(cap|None): the cap from now on"},
    {"clone", (PyCFunction)(void (*)(void))session_clone, METH_VARARGS | METH_KEYWORDS, clone_doc},
    {"result", (PyCFunction)session_result, METH_NOARGS, result_doc},

    {NULL, NULL, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0) "alloctune.sim._native.Session", /* tp_name */
    sizeof(Session),                                                  /* tp_basicsize */
};

static const char int64_doc[] =
    "int64(list) -> bytes | None: the list's ints as native int64 values (None when one is not an int\n"
    "or does not fit); what array('q', list) makes, without its per-item argument parsing.";

static PyObject *py_int64(PyObject *self, PyObject *list) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "int64() takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!out) return NULL;
    int64_t *v = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        int overflow = 0;
        long long y = PyLong_Check(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : (overflow = 1, 0);
        if (overflow || (y == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        v[i] = (int64_t)y;
    }
    return out;
}

/* ------------------------------------------------------------------ splice (remedy.model.spliced) */
static const char splice_doc[] =
    "splice(columns, ids, keys, before, changed, given_stacks, int64_columns=None)\n"
    "    -> (columns, ids|None, new_index, made, int64_columns|None)\n\n"
    "remedy.model.spliced's bulk work on a request stream: columns: its five lists (ops, sizes, rids,\n"
    "streams, event_index) of one length n; ids: its stack ids (a list) or None; keys: the sorted keys of\n"
    "before {r: rows put in just before request r, r <= n} and changed {r: the row that takes request\n"
    "r's place, or None: dropped}; a row is (op, size, rid, stream, event index, stack id). Returns the\n"
    "new stream's five lists and stack ids (a row's own when given_stacks, else -1), new_index (a\n"
    "bytearray of n + 1 int64: where each old request went, the last the new length), made (the new\n"
    "positions of the rows) and, when int64_columns holds the old stream's ops, sizes, rids and streams\n"
    "as int64 buffers, the new stream's four as bytes (None when a row's value does not fit).";

typedef struct {
    PyObject *cols[5];     /* the old lists */
    PyObject *old_ids;     /* a list, or Py_None */
    const int64_t *c64[4]; /* the old int64 columns, or NULL */
    Py_ssize_t n;
    int given_stacks;
    /* what is made (NULL while the walk only counts) */
    PyObject *out[5];
    PyObject *ids;
    int64_t *o64[4];
    int64_t *new_index;
    PyObject *made;
} Splice;

/* the rows of `v` (a sequence of 6-tuples) at *pos (counted only while sp->out[0] is NULL) */
static int splice_rows(Splice *sp, PyObject *v, Py_ssize_t *pos) {
    PyObject *seq = PySequence_Fast(v, "splice rows must be sequences of rows");
    if (!seq) return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, j);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 6) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a splice row is a tuple of 6 values");
            return -1;
        }
        if (sp->out[0]) {
            for (int c = 0; c < 5; c++) {
                PyObject *x = PyTuple_GET_ITEM(row, c);
                Py_INCREF(x);
                PyList_SET_ITEM(sp->out[c], *pos, x);
                if (c < 4 && sp->o64[0]) {
                    int overflow = 0;
                    long long y = PyLong_Check(x) ? PyLong_AsLongLongAndOverflow(x, &overflow) : (overflow = 1, 0);
                    if (overflow || (y == -1 && PyErr_Occurred())) {
                        PyErr_Clear();
                        for (int d = 0; d < 4; d++) {
                            free(sp->o64[d]);
                            sp->o64[d] = NULL;
                        }
                    } else {
                        sp->o64[c][*pos] = (int64_t)y;
                    }
                }
            }
            if (sp->ids != Py_None) {
                PyObject *x = sp->given_stacks ? PyTuple_GET_ITEM(row, 5) : NULL;
                x = x ? (Py_INCREF(x), x) : PyLong_FromLong(-1);
                if (!x) {
                    Py_DECREF(seq);
                    return -1;
                }
                PyList_SET_ITEM(sp->ids, *pos, x);
            }
            PyObject *at = PyLong_FromSsize_t(*pos);
            if (!at || PyList_Append(sp->made, at)) {
                Py_XDECREF(at);
                Py_DECREF(seq);
                return -1;
            }
            Py_DECREF(at);
        }
        (*pos)++;
    }
    Py_DECREF(seq);
    return 0;
}

/* old requests [start, stop) to *pos */
static void splice_copy(Splice *sp, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t *pos) {
    if (stop <= start) return;
    if (sp->out[0]) {
        for (Py_ssize_t r = start; r < stop; r++) {
            Py_ssize_t at = *pos + (r - start);
            for (int c = 0; c < 5; c++) {
                PyObject *x = PyList_GET_ITEM(sp->cols[c], r);
                Py_INCREF(x);
                PyList_SET_ITEM(sp->out[c], at, x);
            }
            if (sp->ids != Py_None) {
                PyObject *x = PyList_GET_ITEM(sp->old_ids, r);
                Py_INCREF(x);
                PyList_SET_ITEM(sp->ids, at, x);
            }
            sp->new_index[r] = at;
        }
        if (sp->o64[0])
            for (int c = 0; c < 4; c++)
                memcpy(sp->o64[c] + *pos, sp->c64[c] + start, (size_t)(stop - start) * sizeof(int64_t));
    }
    *pos += stop - start;
}

/* one walk over the keys: counts the new length (sp->out[0] NULL) or fills the new columns */
static int splice_walk(Splice *sp, PyObject *keys, PyObject *before, PyObject *changed, Py_ssize_t *len) {
    Py_ssize_t pos = 0, prev = 0, n = sp->n, nk = PyList_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t r = PyNumber_AsSsize_t(key, PyExc_OverflowError);
        if (r == -1 && PyErr_Occurred()) return -1;
        if (r < prev || r > n) {
            PyErr_SetString(PyExc_ValueError, "splice keys must be sorted request indices in [0, n]");
            return -1;
        }
        PyObject *rows = PyDict_GetItemWithError(before, key);
        if (!rows && PyErr_Occurred()) return -1;
        if (rows) {
            splice_copy(sp, prev, r, &pos);
            if (splice_rows(sp, rows, &pos)) return -1;
            prev = r;
        }
        if (r >= n) break;
        PyObject *row = PyDict_GetItemWithError(changed, key);
        if (!row && PyErr_Occurred()) return -1;
        if (row) {
            splice_copy(sp, prev, r, &pos);
            if (sp->out[0]) sp->new_index[r] = pos;
            if (row != Py_None) {
                PyObject *one = PyTuple_Pack(1, row);
                if (!one) return -1;
                int bad = splice_rows(sp, one, &pos);
                Py_DECREF(one);
                if (bad) return -1;
            }
            prev = r + 1;
        }
    }
    splice_copy(sp, prev, n, &pos);
    *len = pos;
    return 0;
}

static PyObject *py_splice(PyObject *self, PyObject *args) {
    PyObject *o_cols, *old_ids, *keys, *before, *changed, *o_c64 = Py_None;
    int given_stacks;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!p|O", &PyTuple_Type, &o_cols, &old_ids, &PyList_Type, &keys, &PyDict_Type,
                          &before, &PyDict_Type, &changed, &given_stacks, &o_c64))
        return NULL;
    if (PyTuple_GET_SIZE(o_cols) != 5) {
        PyErr_SetString(PyExc_ValueError, "splice takes the five request columns");
        return NULL;
    }
    Splice sp;
    memset(&sp, 0, sizeof(sp));
    sp.old_ids = old_ids;
    sp.given_stacks = given_stacks;
    sp.ids = Py_None;
    sp.n = -1;
    for (int c = 0; c < 5; c++) {
        sp.cols[c] = PyTuple_GET_ITEM(o_cols, c);
        if (!PyList_Check(sp.cols[c]) || (sp.n >= 0 && PyList_GET_SIZE(sp.cols[c]) != sp.n)) {
            PyErr_SetString(PyExc_ValueError, "the request columns must be lists of one length");
            return NULL;
        }
        sp.n = PyList_GET_SIZE(sp.cols[c]);
    }
    Py_ssize_t n = sp.n;
    if (old_ids != Py_None && (!PyList_Check(old_ids) || PyList_GET_SIZE(old_ids) != n)) {
        PyErr_SetString(PyExc_ValueError, "stack ids must be a list as long as the columns, or None");
        return NULL;
    }
    Py_buffer views[4];
    int nviews = 0;
    PyObject *res = NULL, *new_index = NULL, *o64 = Py_None;
    if (o_c64 != Py_None) {
        if (!PyTuple_Check(o_c64) || PyTuple_GET_SIZE(o_c64) != 4) {
            PyErr_SetString(PyExc_ValueError, "int64_columns must be a tuple of 4 int64 buffers or None");
            return NULL;
        }
        for (; nviews < 4; nviews++) {
            if (get_i64_buffer(PyTuple_GET_ITEM(o_c64, nviews), &views[nviews], n, "int64 column")) goto done;
            sp.c64[nviews] = views[nviews].buf;
        }
    }
    Py_ssize_t len = 0;
    if (splice_walk(&sp, keys, before, changed, &len)) goto done;
    for (int c = 0; c < 5; c++)
        if (!(sp.out[c] = PyList_New(len))) goto done;
    if (old_ids != Py_None && !(sp.ids = PyList_New(len))) {
        sp.ids = Py_None;
        goto done;
    }
    if (!(new_index = PyByteArray_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int64_t))) ||
        !(sp.made = PyList_New(0)))
        goto done;
    sp.new_index = (int64_t *)PyByteArray_AS_STRING(new_index);
    memset(sp.new_index, 0, (size_t)(n + 1) * sizeof(int64_t));
    if (nviews == 4)
        for (int c = 0; c < 4; c++)
            if (!(sp.o64[c] = malloc((size_t)(len ? len : 1) * sizeof(int64_t)))) {
                PyErr_NoMemory();
                goto done;
            }
    Py_ssize_t got = 0;
    if (splice_walk(&sp, keys, before, changed, &got)) goto done;
    if (got != len) {
        PyErr_SetString(PyExc_RuntimeError, "splice: the rows changed while being copied");
        goto done;
    }
    sp.new_index[n] = len;
    if (sp.o64[0]) {
        if (!(o64 = PyTuple_New(4))) goto done;
        for (int c = 0; c < 4; c++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)sp.o64[c], len * (Py_ssize_t)sizeof(int64_t));
            if (!b) goto done;
            PyTuple_SET_ITEM(o64, c, b);
        }
    }
    res = Py_BuildValue("((OOOOO)OOOO)", sp.out[0], sp.out[1], sp.out[2], sp.out[3], sp.out[4], sp.ids, new_index,
                        sp.made, o64);
done:
    for (int c = 0; c < 5; c++) Py_XDECREF(sp.out[c]);
    for (int c = 0; c < 4; c++) free(sp.o64[c]);
    for (int c = 0; c < nviews; c++) PyBuffer_Release(&views[c]);
    if (sp.ids != Py_None) Py_DECREF(sp.ids);
    if (o64 != Py_None) Py_XDECREF(o64);
    Py_XDECREF(new_index);
    Py_XDECREF(sp.made);
    return res;
}

static PyMethodDef methods[] = {
    {"session", py_session, METH_VARARGS, session_doc},
    {"int64", py_int64, METH_O, int64_doc},
    {"splice", py_splice, METH_VARARGS, splice_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_native", "Native replay core of alloctune's allocator simulator (see _native.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    SessionType.tp_dealloc = (destructor)session_dealloc;
    SessionType.tp_flags = Py_TPFLAGS_DEFAULT;
    SessionType.tp_doc = "A paused replay (see session()).";
    SessionType.tp_methods = session_methods;
    SessionType.tp_getset = session_getset;
    if (PyType_Ready(&SessionType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
