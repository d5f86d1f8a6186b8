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
 * The driver's address choices stay in Python (the address model objects are called back
 * once per segment creation/release: rare next to requests), so every address model, the
 * recorded one included, behaves exactly as in the Python core.
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
} Seg;

typedef struct Blk {
    int64_t addr, size, requested, gc_base;
    int64_t k_size, k_id, k_addr; /* the key it was inserted with (Python's b.key) */
    Seg *seg;
    struct Blk *prev, *next; /* neighbours in the segment */
    struct Blk *l, *r;       /* treap children */
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
    PyObject *addr_alloc, *addr_free, *va_alloc, *va_free;
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
    int error; /* a Python exception is set */
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
            PyErr_NoMemory();
            a->error = 1;
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
            PyErr_NoMemory();
            a->error = 1;
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
            PyErr_NoMemory();
            a->error = 1;
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
        a->error = 1;
        return 0;
    }
    int64_t v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) a->error = 1;
    return v;
}

static void call_free(A *a, PyObject *fn, int64_t addr, int64_t size) {
    PyObject *r = PyObject_CallFunction(fn, "LL", (long long)addr, (long long)size);
    if (!r)
        a->error = 1;
    else
        Py_DECREF(r);
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
        PyErr_NoMemory();
        a->error = 1;
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
    call_free(a, a->addr_free, b->addr, b->size);
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
    int64_t base = call_alloc(a, a->va_alloc, vsize);
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
    call_free(a, a->va_free, seg->addr, seg->size);
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
                        PyErr_NoMemory();
                        a->error = 1;
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
    if (a->has_cap && st->reserved + alloc_size > a->cap) return NULL;
    if (a->expandable) return try_allocate_expandable(a, pool, size, stream);
    if (a->used + alloc_size > a->usable) return NULL; /* cudaMalloc fails */
    a->used += alloc_size;
    int64_t addr = call_alloc(a, a->addr_alloc, alloc_size);
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
typedef struct {
    LiveSlot *slots;
    size_t mask, n;
} Live;

static inline size_t hmix(int64_t k) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
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

static int live_grow(Live *t) {
    LiveSlot *old = t->slots;
    size_t oldcap = t->mask + 1;
    if (live_init(t, oldcap)) {
        t->slots = old;
        return -1;
    }
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].b) live_put(t, old[i].key, old[i].b);
    free(old);
    return 0;
}

static int live_put(Live *t, int64_t key, Blk *b) {
    if ((t->n + 1) * 2 > t->mask + 1 && live_grow(t)) return -1;
    size_t i = hmix(key) & t->mask;
    while (t->slots[i].b) {
        if (t->slots[i].key == key) {
            t->slots[i].b = b; /* an id reused while live: the old block stays allocated (leaks), as in Python */
            return 0;
        }
        i = (i + 1) & t->mask;
    }
    t->slots[i].key = key;
    t->slots[i].b = b;
    t->n++;
    return 0;
}

static Blk *live_pop(Live *t, int64_t key) {
    size_t i = hmix(key) & t->mask;
    while (t->slots[i].b) {
        if (t->slots[i].key == key) break;
        i = (i + 1) & t->mask;
    }
    Blk *b = t->slots[i].b;
    if (!b) return NULL;
    /* backward-shift deletion keeps probe chains intact */
    size_t j = i;
    for (;;) {
        t->slots[i].b = NULL;
        for (;;) {
            j = (j + 1) & t->mask;
            if (!t->slots[j].b) {
                t->n--;
                return b;
            }
            size_t h = hmix(t->slots[j].key) & t->mask;
            /* can slot j's entry move to i? only if its home h is not in (i, j] cyclically */
            if (i <= j ? (h <= i || h > j) : (h <= i && h > j)) break;
        }
        t->slots[i] = t->slots[j];
        i = j;
    }
}

/* ------------------------------------------------------------------ module entry */
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
        view->len / 8 != n) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a buffer of %zd int64 values", name, n);
        return -1;
    }
    return 0;
}

static const char replay_doc[] =
    "replay(ops, sizes, rids, streams, fallbacks, settings, device, callbacks, flags) -> tuple\n\n"
    "Run replay.py's request loop natively. ops/sizes/rids/streams: int64 buffers of equal length;\n"
    "fallbacks: {request index: tuple of sizes}; settings: (cap|None, gc_threshold, mss|None, nsr,\n"
    "mid_segment, expandable, table|None, id_key); device: (total, overhead); callbacks:\n"
    "(addr_alloc, addr_free, va_alloc, va_free); flags: (record_events, stop_at_oom, step).\n"
    "Returns (done, stats, events|None, oom|None, expected, failures, surprises, adapted, t_index, t_alloc).";

static PyObject *py_replay(PyObject *self, PyObject *args) {
    PyObject *o_ops, *o_sizes, *o_rids, *o_streams, *fallbacks, *settings, *device, *callbacks, *flags;
    if (!PyArg_ParseTuple(args, "OOOOO!O!O!O!O!", &o_ops, &o_sizes, &o_rids, &o_streams, &PyDict_Type, &fallbacks,
                          &PyTuple_Type, &settings, &PyTuple_Type, &device, &PyTuple_Type, &callbacks, &PyTuple_Type,
                          &flags))
        return NULL;
    A a;
    memset(&a, 0, sizeof(a));
    a.rng = 2463534242u;
    a.small_pool.small = 1;
    PyObject *o_cap, *o_mss, *o_table;
    long long nsr, mid;
    int expandable, id_key;
    if (!PyArg_ParseTuple(settings, "OdOLLpOp", &o_cap, &a.gc_threshold, &o_mss, &nsr, &mid, &expandable, &o_table,
                          &id_key))
        return NULL;
    a.nsr = nsr;
    a.mid_segment = mid;
    a.expandable = expandable;
    a.id_key = id_key;
    if (o_cap != Py_None) {
        a.has_cap = 1;
        a.cap = PyLong_AsLongLong(o_cap);
        if (a.cap == -1 && PyErr_Occurred()) return NULL;
    }
    a.gc_on = a.has_cap && a.gc_threshold > 0;
    if (o_mss != Py_None) {
        a.has_mss = 1;
        a.mss = PyLong_AsLongLong(o_mss);
        if (a.mss == -1 && PyErr_Occurred()) return NULL;
    }
    if (o_table != Py_None) {
        if (!PyTuple_Check(o_table) || PyTuple_GET_SIZE(o_table) != 16) {
            PyErr_SetString(PyExc_ValueError, "table must be a tuple of 16 ints or None");
            return NULL;
        }
        a.has_table = 1;
        for (int i = 0; i < 16; i++) {
            a.table[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o_table, i));
            if (a.table[i] == -1 && PyErr_Occurred()) return NULL;
        }
    }
    long long total, overhead;
    if (!PyArg_ParseTuple(device, "LL", &total, &overhead)) return NULL;
    a.total = total;
    a.overhead = overhead;
    a.usable = total - overhead;
    if (!PyArg_ParseTuple(callbacks, "OOOO", &a.addr_alloc, &a.addr_free, &a.va_alloc, &a.va_free)) return NULL;
    int record_events, stop_at_oom;
    Py_ssize_t step;
    if (!PyArg_ParseTuple(flags, "ppn", &record_events, &stop_at_oom, &step)) return NULL;
    a.record_events = record_events;
    if (step < 1) step = 1;

    Py_ssize_t n = PyObject_Length(o_ops);
    if (n < 0) return NULL;
    Py_buffer b_ops, b_sizes, b_rids, b_streams;
    if (get_i64_buffer(o_ops, &b_ops, n, "ops")) return NULL;
    if (get_i64_buffer(o_sizes, &b_sizes, n, "sizes")) {
        PyBuffer_Release(&b_ops);
        return NULL;
    }
    if (get_i64_buffer(o_rids, &b_rids, n, "rids")) {
        PyBuffer_Release(&b_ops);
        PyBuffer_Release(&b_sizes);
        return NULL;
    }
    if (get_i64_buffer(o_streams, &b_streams, n, "streams")) {
        PyBuffer_Release(&b_ops);
        PyBuffer_Release(&b_sizes);
        PyBuffer_Release(&b_rids);
        return NULL;
    }
    const int64_t *ops = b_ops.buf, *sizes = b_sizes.buf, *rids = b_rids.buf, *streams = b_streams.buf;

    PyObject *expected = PyList_New(0), *failures = PyList_New(0), *surprises = PyList_New(0);
    PyObject *adapted = PyList_New(0), *t_index = PyList_New(0), *t_alloc = PyList_New(0);
    PyObject *result = NULL;
    Live live;
    live.slots = NULL;
    int has_result_oom = 0;
    OOM result_oom;
    memset(&result_oom, 0, sizeof(result_oom));
    Py_ssize_t done = n;
    int64_t bucket_max = 0;
    Py_ssize_t next_mark = step;
    Stats *st = &a.st;
    if (!expected || !failures || !surprises || !adapted || !t_index || !t_alloc) goto out;
    if (live_init(&live, 1024)) {
        PyErr_NoMemory();
        goto out;
    }

#define APPEND_INT(list, v)                                 \
    do {                                                    \
        PyObject *_o = PyLong_FromLongLong((long long)(v)); \
        if (!_o || PyList_Append(list, _o)) {               \
            Py_XDECREF(_o);                                 \
            goto out;                                       \
        }                                                   \
        Py_DECREF(_o);                                      \
    } while (0)

    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == next_mark) {
            APPEND_INT(t_index, i);
            APPEND_INT(t_alloc, bucket_max);
            bucket_max = st->allocated;
            next_mark += step;
        }
        int64_t op = ops[i];
        if (op == OP_ALLOC) {
            a.request_index = i;
            Blk *b = sim_malloc(&a, sizes[i], streams[i]);
            if (a.error) goto out;
            if (!b && PyDict_GET_SIZE(fallbacks)) {
                PyObject *key = PyLong_FromSsize_t(i);
                if (!key) goto out;
                PyObject *fb = PyDict_GetItemWithError(fallbacks, key);
                Py_DECREF(key);
                if (!fb && PyErr_Occurred()) goto out;
                if (fb) {
                    PyObject *seq = PySequence_Fast(fb, "fallbacks must be sequences of sizes");
                    if (!seq) goto out;
                    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq) && !b; k++) {
                        long long fs = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
                        if (fs == -1 && PyErr_Occurred()) {
                            Py_DECREF(seq);
                            goto out;
                        }
                        b = sim_malloc(&a, fs, streams[i]);
                        if (a.error) {
                            Py_DECREF(seq);
                            goto out;
                        }
                    }
                    Py_DECREF(seq);
                    if (b) APPEND_INT(adapted, i);
                }
            }
            if (!b) {
                has_result_oom = a.has_oom;
                result_oom = a.oom;
                if (stop_at_oom) {
                    done = i;
                    break;
                }
                continue;
            }
            if (live_put(&live, rids[i], b)) {
                PyErr_NoMemory();
                goto out;
            }
            if (st->allocated > bucket_max) bucket_max = st->allocated;
        } else if (op == OP_FREE) {
            Blk *b = live_pop(&live, rids[i]);
            if (b) sim_free(&a, b);
        } else if (op == OP_EMPTY_CACHE) {
            a.request_index = i;
            release_cached(&a);
            if (a.error) goto out;
        } else if (op == OP_FAILED_ALLOC) {
            a.request_index = i;
            Blk *b = sim_malloc(&a, sizes[i], streams[i]);
            if (a.error) goto out;
            if (!b) {
                APPEND_INT(expected, i);
                PyObject *t = oom_tuple(&a, &a.oom);
                if (!t || PyList_Append(failures, t)) {
                    Py_XDECREF(t);
                    goto out;
                }
                Py_DECREF(t);
            } else {
                APPEND_INT(surprises, i);
                sim_free(&a, b);
            }
        }
    }
    APPEND_INT(t_index, done);
    APPEND_INT(t_alloc, bucket_max);
    {
        PyObject *stats = PyTuple_New(NSTATS);
        if (!stats) goto out;
        int64_t *sv = (int64_t *)st;
        for (int k = 0; k < NSTATS; k++) {
            PyObject *v = PyLong_FromLongLong((long long)sv[k]);
            if (!v) {
                Py_DECREF(stats);
                goto out;
            }
            PyTuple_SET_ITEM(stats, k, v);
        }
        PyObject *events;
        if (record_events) {
            events = PyList_New((Py_ssize_t)a.nev);
            if (!events) {
                Py_DECREF(stats);
                goto out;
            }
            for (size_t k = 0; k < a.nev; k++) {
                Event *e = &a.events[k];
                PyObject *t = Py_BuildValue("(iLLLL)", (int)e->action, (long long)e->addr, (long long)e->size,
                                            (long long)e->stream, (long long)e->ri);
                if (!t) {
                    Py_DECREF(stats);
                    Py_DECREF(events);
                    goto out;
                }
                PyList_SET_ITEM(events, (Py_ssize_t)k, t);
            }
        } else {
            Py_INCREF(Py_None);
            events = Py_None;
        }
        PyObject *oom;
        if (has_result_oom) {
            oom = oom_tuple(&a, &result_oom);
            if (!oom) {
                Py_DECREF(stats);
                Py_DECREF(events);
                goto out;
            }
        } else {
            Py_INCREF(Py_None);
            oom = Py_None;
        }
        result = Py_BuildValue("(nNNNOOOOOO)", done, stats, events, oom, expected, failures, surprises, adapted,
                               t_index, t_alloc);
    }
out:
    free(live.slots);
    a_free(&a);
    PyBuffer_Release(&b_ops);
    PyBuffer_Release(&b_sizes);
    PyBuffer_Release(&b_rids);
    PyBuffer_Release(&b_streams);
    Py_XDECREF(expected);
    Py_XDECREF(failures);
    Py_XDECREF(surprises);
    Py_XDECREF(adapted);
    Py_XDECREF(t_index);
    Py_XDECREF(t_alloc);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", py_replay, METH_VARARGS, replay_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_native", "Native replay core of alloctune's allocator simulator (see _native.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&moddef); }
