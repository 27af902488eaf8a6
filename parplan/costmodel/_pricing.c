/* parplan's compiled pricing core: what each side of a split receives for one node, and what
 * that costs in seconds (docs/costmodel.md sections 3, 4, 4.2 and 6.4; docs/architecture.md,
 * "The compiled core").
 *
 * This file is the only implementation of the re-layout amounts in the product: the closed
 * forms of a node whose consumers read exactly what its group holds (section 3's one-split
 * formulas: L-shaped needs, rectangular holdings), the region algebra of lower groups (areas of
 * boxes by inclusion-exclusion), the intra-layer terms and the receive time with its latency,
 * micro-batches and overlap. parplan.costmodel.cost.node_terms lays the data out and calls
 * relayout(); tests/pricing_oracle.py is the Python it replaced, kept as a test oracle, and
 * tests/reference_model.py the independent model written from the docs.
 *
 * Every operation follows the order of the oracle's, one IEEE double operation at a time
 * (built with -ffp-contract=off: no fused multiply-add), so both give the same bits and the
 * planners' tie-breaks do not move.
 *
 * No numpy headers: arrays come in through the buffer protocol, as float64 / int64. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Fields of a packed state table (rows of a (NF, S) float64 array): StateTable.packed. */
enum { F_LO, F_HI, F_HAS0, F_HAS1, F_GIVE, F_NEED, F_INTRA0, F_INTRA1, F_WINTRA0, F_WINTRA1, F_EXTRA, NF };

#define RECEIVE_EPS 1e-9 /* cost.RECEIVE_EPS */
#define MAXK 128         /* nodes in one factor's scope */
#define MAXD 32          /* dimensions of the index grid */
#define MAXC 24          /* consumers of one tensor on the region path (2^n subsets) */

typedef struct {
    double x0, x1, y0, y1;
} Rect;

/* Python's max/min of two floats: the first unless the second is strictly larger/smaller. */
static inline double pmax(double a, double b) { return b > a ? b : a; }
static inline double pmin(double a, double b) { return b < a ? b : a; }

/* ---- closed forms (section 3: a side's own share s, the tensor a unit square) ------------- */

/* (X, Y) of rect(X, Y) a side holds in layout `code` (0 rows, 1 columns, 2 whole). */
static inline void hold_extent(int code, double s, double has, double *x, double *y) {
    if (code == 0) { *x = s; *y = 1.0; }
    else if (code == 1) { *x = 1.0; *y = s; }
    else { *x = has; *y = has; }
}

/* (x, y) of the L-shape rect(x, 1) | rect(1, y) a side needs in layout `code`. */
static inline void need_extent(int code, double s, double has, double *x, double *y) {
    if (code == 0) { *x = s; *y = 0.0; }
    else if (code == 1) { *x = 0.0; *y = s; }
    else { *x = has; *y = has; }
}

/* Area of the L-shape (x, y) outside the rectangle (hx, hy). */
static inline double forward_extent(double x, double y, double hx, double hy) {
    double mx = pmin(x, hx), my = pmin(y, hy);
    return (x + y - x * y) - (mx * hy + hx * my - mx * my);
}

/* Area of the rectangle (x, y) outside the rectangle (hx, hy). */
static inline double backward_extent(double x, double y, double hx, double hy) {
    return x * y - pmin(x, hx) * pmin(y, hy);
}

/* ---- region algebra (section 3: boxes of root rows x columns) ------------------------------ */

/* The rectangle a side keeps of a port at a split: `r` the port at the group, `code` its layout,
 * `s` the side's own share, `has` whether it has work. */
static inline Rect child_rect(Rect r, int code, double s, int side, int has) {
    Rect o = r;
    if (!has) { o.x1 = r.x0; return o; }
    if (code == 0) {
        if (side == 0) o.x1 = r.x0 + s * (r.x1 - r.x0);
        else o.x0 = r.x1 - s * (r.x1 - r.x0);
    } else if (code == 1) {
        if (side == 0) o.y1 = r.y0 + s * (r.y1 - r.y0);
        else o.y0 = r.y1 - s * (r.y1 - r.y0);
    }
    return o;
}

/* Area of the intersection of n rectangles. */
static double area(const Rect *const *r, int n) {
    double x0 = r[0]->x0, x1 = r[0]->x1, y0 = r[0]->y0, y1 = r[0]->y1;
    for (int i = 1; i < n; ++i) {
        x0 = pmax(x0, r[i]->x0); x1 = pmin(x1, r[i]->x1);
        y0 = pmax(y0, r[i]->y0); y1 = pmin(y1, r[i]->y1);
    }
    return pmax(x1 - x0, 0.0) * pmax(y1 - y0, 0.0);
}

/* The next k-subset of {0..n-1} in lexicographic order (itertools.combinations' order). */
static int next_subset(int *c, int k, int n) {
    int i = k - 1;
    while (i >= 0 && c[i] == n - k + i) --i;
    if (i < 0) return 0;
    ++c[i];
    for (int j = i + 1; j < k; ++j) c[j] = c[j - 1] + 1;
    return 1;
}

/* Area of (union of a[0..na)) & within[0..nw), by inclusion-exclusion. */
static double union_area(const Rect *a, int na, const Rect *const *within, int nw) {
    const Rect *buf[2 * MAXC + 8];
    int c[MAXC];
    double total = 0.0;
    for (int k = 1; k <= na; ++k) {
        double sign = (k % 2) ? 1.0 : -1.0;
        for (int j = 0; j < k; ++j) c[j] = j;
        do {
            int n = 0;
            for (int j = 0; j < k; ++j) buf[n++] = &a[c[j]];
            for (int j = 0; j < nw; ++j) buf[n++] = within[j];
            total = total + sign * area(buf, n);
        } while (next_subset(c, k, na));
    }
    return total;
}

/* Area of (union a) & (union b) & within. */
static double both_unions_area(const Rect *a, int na, const Rect *b, int nb, const Rect *const *within, int nw) {
    const Rect *buf[2 * MAXC + 8];
    int ca[MAXC], cb[MAXC];
    double total = 0.0;
    for (int i = 1; i <= na; ++i) {
        for (int x = 0; x < i; ++x) ca[x] = x;
        do {
            for (int j = 1; j <= nb; ++j) {
                for (int x = 0; x < j; ++x) cb[x] = x;
                do {
                    double sign = ((i + j) % 2 == 0) ? 1.0 : -1.0;
                    int n = 0;
                    for (int x = 0; x < i; ++x) buf[n++] = &a[ca[x]];
                    for (int x = 0; x < j; ++x) buf[n++] = &b[cb[x]];
                    for (int x = 0; x < nw; ++x) buf[n++] = within[x];
                    total = total + sign * area(buf, n);
                } while (next_subset(cb, j, nb));
            }
        } while (next_subset(ca, i, na));
    }
    return total;
}

/* Area of (intersection of base) - (union of minus). */
static double minus_area(const Rect *const *base, int nb, const Rect *minus, int nm) {
    double a = area(base, nb);
    return a - (nm ? union_area(minus, nm, base, nb) : 0.0);
}

/* What side `side` receives of a producer's output: g its holding at the group, h its sides',
 * p / q each consumer's need on side 1 / 2. */
static double forward_area(Rect g, const Rect *h, const Rect *p, const Rect *q, int n, int side) {
    const Rect *w1[1], *w2[1];
    if (side == 0) {
        w1[0] = &g; w2[0] = &h[0];
        return union_area(p, n, w1, 1) - union_area(p, n, w2, 1);
    }
    w1[0] = &g; w2[0] = &h[1];
    return union_area(q, n, w1, 1) - union_area(q, n, w2, 1) + both_unions_area(q, n, p, n, NULL, 0)
           - both_unions_area(q, n, p, n, w1, 1);
}

/* What side `side` receives of one consumer's gradient (m, p, q its regions at the group and on
 * the sides), for a producer needing h on the sides. */
static double backward_area(const Rect *h, Rect m, Rect p, Rect q, int side) {
    const Rect *b[3];
    if (side == 0) {
        b[0] = &h[0]; b[1] = &m;
        double x = area(b, 2);
        b[1] = &p;
        return x - area(b, 2);
    }
    b[0] = &h[1]; b[1] = &m;
    double a1 = area(b, 2);
    b[1] = &h[0];
    double a2 = area(b, 2);
    b[2] = &m;
    double a3 = area(b, 3);
    b[1] = &q;
    double a4 = area(b, 2);
    return a1 + a2 - a3 - a4;
}

/* What side `side` receives when the sender is one device that pre-sums the contributions of
 * every consumer to a point. */
static double backward_presummed(const Rect *h, const Rect *m, const Rect *p, const Rect *q, int n, int side) {
    const Rect *base[MAXC + 2];
    Rect minus[MAXC];
    int s[MAXC], in[MAXC];
    double total = 0.0;
    for (int k = 1; k <= n; ++k) {
        double sign = (k % 2) ? 1.0 : -1.0;
        for (int j = 0; j < k; ++j) s[j] = j;
        do {
            if (side == 0) { /* h0 & M_v - P_v for every v in s */
                int nb = 0;
                base[nb++] = &h[0];
                for (int j = 0; j < k; ++j) base[nb++] = &m[s[j]];
                for (int j = 0; j < k; ++j) minus[j] = p[s[j]];
                total = total + sign * minus_area(base, nb, minus, k);
                continue;
            }
            /* h1 & [(M_v - Q_v) | (h0 - M_v)] for every v in s: disjoint by which v are inside M_v */
            for (int j = 0; j <= k; ++j) {
                for (int x = 0; x < j; ++x) in[x] = x; /* positions in s */
                do {
                    int nb = 0, nm = 0, inside[MAXC] = {0};
                    for (int x = 0; x < j; ++x) inside[in[x]] = 1;
                    base[nb++] = &h[1];
                    for (int x = 0; x < j; ++x) base[nb++] = &m[s[in[x]]];
                    if (j < k) base[nb++] = &h[0];
                    for (int x = 0; x < j; ++x) minus[nm++] = q[s[in[x]]];
                    for (int x = 0; x < k; ++x)
                        if (!inside[x]) minus[nm++] = m[s[x]];
                    total = total + sign * minus_area(base, nb, minus, nm);
                } while (j > 0 && next_subset(in, j, k));
            }
        } while (next_subset(s, k, n));
    }
    return total;
}

/* ---- seconds (sections 4, 4.2, 6.4) ------------------------------------------------------- */

typedef struct {
    double bpe, bw[2], latency;
    long micro, zero;
    int overlap, leaf_pair;
    double per_el[2]; /* bpe / bw[i] */
} Side;

/* Seconds a side spends receiving `el` elements, `wel` of them a per-step weight exchange. */
static inline double receive_seconds(const Side *sd, int i, double el, double wel) {
    double transfer = el * sd->per_el[i];
    long m = sd->micro;
    if (m == 1) return sd->latency * (el > RECEIVE_EPS ? 1.0 : 0.0) + transfer;
    long per_step = sd->zero < 2 ? 1 : m;
    long a = m * (el - wel > RECEIVE_EPS ? 1 : 0), b = per_step * (wel > RECEIVE_EPS ? 1 : 0);
    long count = b > a ? b : a;
    return sd->latency * (double)count + transfer;
}

/* ---- one node's terms over a grid of states ------------------------------------------------ */

/* A tensor node u sends: its size (elements; on the closed-form path already times the area its
 * group holds), its consumers (positions in the scope) and, on the region path, the producer's
 * output box g and each consumer's input box m at the group. */
typedef struct {
    double size;
    double fwd; /* times the forward part moves: 2 when a checkpointed block recomputes it (6.3) */
    int region, n;
    int pos[MAXK];
    Rect g, m[MAXC];
    /* the amounts over all states of the tensor's own members (the producer, then its
     * consumers; the last fastest), each side's after the other's: precomputed when that is
     * fewer cells than the grid, else NULL */
    double *pre;
    Py_ssize_t npre, pstr[MAXK + 1];
    /* closed form with several consumers, not precomputed whole: over the consumers' states the
     * union of their needs and intersection of their holdings per side (uni: nx, ny, hx, hy; the
     * last consumer fastest), and without pre-summing each consumer's backward amount per
     * (producer state, consumer state) and side (back[c]) */
    double *uni, *back[MAXK];
    Py_ssize_t ustr[MAXK];
} Tensor;

static inline double fld(const double *tab, Py_ssize_t S, int f, Py_ssize_t s) { return tab[f * S + s]; }

/* Own share ends of a state on side i: (big, small). */
static inline void ends(const double *tab, Py_ssize_t S, Py_ssize_t s, int i, double *big, double *small) {
    double lo = fld(tab, S, F_LO, s), hi = fld(tab, S, F_HI, s);
    if (i == 0) { *big = hi; *small = lo; }
    else { *big = 1.0 - lo; *small = 1.0 - hi; }
}

/* Per member, state and side, the closed forms' extents (exact copies of the table's numbers
 * and section 3's rules, computed once per call instead of once per cell): the producer's
 * (gx, gy) held at its big end and (wx, wy) at its small end; a consumer's need (nx, ny) at its
 * small end and holding (hx, hy) at its big end. */
static double *extents(const double *tab, Py_ssize_t S, int producer) {
    double *e = PyMem_Malloc(sizeof(double) * 8 * (S ? S : 1));
    if (!e) return NULL;
    for (Py_ssize_t s = 0; s < S; ++s)
        for (int i = 0; i < 2; ++i) {
            double big, small, has = fld(tab, S, F_HAS0 + i, s), *o = e + (s * 2 + i) * 4;
            ends(tab, S, s, i, &big, &small);
            if (producer) {
                int give = (int)fld(tab, S, F_GIVE, s);
                hold_extent(give, big, has, &o[0], &o[1]);
                hold_extent(give, small, has, &o[2], &o[3]);
            } else {
                int need = (int)fld(tab, S, F_NEED, s);
                need_extent(need, small, has, &o[0], &o[1]);
                hold_extent(need, big, has, &o[2], &o[3]);
            }
        }
    return e;
}

static double closed_form(const Tensor *t, double *const *ext, const Py_ssize_t *st, int i, int leaf_pair) {
    double nx = 0, ny = 0, hx = 0, hy = 0;
    for (int c = 0; c < t->n; ++c) {
        const double *e = ext[t->pos[c]] + (st[t->pos[c]] * 2 + i) * 4;
        if (c == 0) { nx = e[0]; ny = e[1]; }
        else { nx = pmax(nx, e[0]); ny = pmax(ny, e[1]); }
    }
    const double *g = ext[0] + (st[0] * 2 + i) * 4;
    double wx = g[2], wy = g[3];
    double moved = t->fwd * forward_extent(nx, ny, g[0], g[1]);
    for (int c = 0; c < t->n; ++c) {
        const double *e = ext[t->pos[c]] + (st[t->pos[c]] * 2 + i) * 4;
        if (!leaf_pair) { moved = moved + backward_extent(wx, wy, e[2], e[3]); continue; }
        if (c == 0) { hx = e[2]; hy = e[3]; }
        else { hx = pmin(hx, e[2]); hy = pmin(hy, e[3]); }
    }
    if (leaf_pair) moved = moved + backward_extent(wx, wy, hx, hy);
    return moved;
}

static double region_form(const Tensor *t, const double *const *tabs, const Py_ssize_t *S, const Py_ssize_t *st,
                          int i, int leaf_pair) {
    Rect small[2][MAXC], big[2][MAXC], hold[2], wants[2];
    const double *tu = tabs[0];
    Py_ssize_t su = st[0];
    for (int c = 0; c < t->n; ++c) {
        int p = t->pos[c];
        int need = (int)fld(tabs[p], S[p], F_NEED, st[p]);
        for (int j = 0; j < 2; ++j) {
            double b, sm;
            int has = fld(tabs[p], S[p], F_HAS0 + j, st[p]) != 0.0;
            ends(tabs[p], S[p], st[p], j, &b, &sm);
            small[j][c] = child_rect(t->m[c], need, sm, j, has);
            big[j][c] = child_rect(t->m[c], need, b, j, has);
        }
    }
    int give = (int)fld(tu, S[0], F_GIVE, su);
    for (int j = 0; j < 2; ++j) {
        double b, sm;
        int has = fld(tu, S[0], F_HAS0 + j, su) != 0.0;
        ends(tu, S[0], su, j, &b, &sm);
        hold[j] = child_rect(t->g, give, b, j, has);
        wants[j] = child_rect(t->g, give, sm, j, has);
    }
    double moved = t->fwd * forward_area(t->g, hold, small[0], small[1], t->n, i);
    if (leaf_pair) return moved + backward_presummed(wants, t->m, big[0], big[1], t->n, i);
    for (int c = 0; c < t->n; ++c) moved = moved + backward_area(wants, t->m[c], big[0][c], big[1][c], i);
    return moved;
}

/* One call's data: the scope's tables and index grid, the tensors, the side. */
typedef struct {
    int k, nd, nt;
    const double *tabs[MAXK];
    const long long *idx[MAXK];
    Py_ssize_t S[MAXK], ilen[MAXK], str[MAXK][MAXD], dims[MAXD], cells;
    double *ext[MAXK];
    Tensor *ts;
    Side sd;
    Py_buffer views[2 * MAXK];
    int nviews;
} Call;

static void call_free(Call *cl) {
    for (int j = 0; j < cl->nviews; ++j) PyBuffer_Release(&cl->views[j]);
    for (int j = 0; j < cl->k; ++j) PyMem_Free(cl->ext[j]);
    for (int t = 0; t < cl->nt; ++t) {
        PyMem_Free(cl->ts[t].pre);
        PyMem_Free(cl->ts[t].uni);
        for (int x = 0; x < cl->ts[t].n; ++x) PyMem_Free(cl->ts[t].back[x]);
    }
    PyMem_Free(cl->ts);
}

static inline double tensor_moved(const Call *cl, const Tensor *t, const Py_ssize_t *st, int i) {
    return t->region ? region_form(t, cl->tabs, cl->S, st, i, cl->sd.leaf_pair)
                     : closed_form(t, cl->ext, st, i, cl->sd.leaf_pair);
}

/* first times the state counts of a tensor's consumers, or (1 << 30) once it passes that (a
 * node read by dozens of consumers: the product would overflow) */
static Py_ssize_t capped_product(Py_ssize_t first, const Call *cl, const Tensor *t) {
    Py_ssize_t n = first;
    for (int c = 0; c < t->n; ++c) {
        Py_ssize_t s = cl->S[t->pos[c]];
        if (s > 0 && n > ((Py_ssize_t)1 << 30) / s) return (Py_ssize_t)1 << 30;
        n *= s;
    }
    return n;
}

/* The consumer tables of a closed-form tensor with several consumers (Tensor.uni, .back), when
 * they are smaller than the grid; the same max / min folds and the same backward amounts as
 * closed_form, so the same bits. */
static int split_consumers(Call *cl, Tensor *t) {
    Py_ssize_t S0 = cl->S[0], n = capped_product(1, cl, t);
    if (n > (1 << 22) || n * S0 > cl->cells) return 0;
    t->uni = PyMem_Malloc(sizeof(double) * 8 * (n ? n : 1));
    if (!t->uni) { PyErr_NoMemory(); return -1; }
    t->ustr[t->n - 1] = 1;
    for (int c = t->n - 2; c >= 0; --c) t->ustr[c] = t->ustr[c + 1] * cl->S[t->pos[c + 1]];
    Py_ssize_t mi[MAXK];
    memset(mi, 0, sizeof(mi));
    for (Py_ssize_t off = 0; off < n; ++off) {
        for (int i = 0; i < 2; ++i) {
            double *u = t->uni + (off * 2 + i) * 4;
            for (int c = 0; c < t->n; ++c) {
                const double *e = cl->ext[t->pos[c]] + (mi[c] * 2 + i) * 4;
                if (c == 0) { u[0] = e[0]; u[1] = e[1]; u[2] = e[2]; u[3] = e[3]; }
                else { u[0] = pmax(u[0], e[0]); u[1] = pmax(u[1], e[1]); u[2] = pmin(u[2], e[2]); u[3] = pmin(u[3], e[3]); }
            }
        }
        for (int c = t->n - 1; c >= 0; --c) {
            if (++mi[c] < cl->S[t->pos[c]]) break;
            mi[c] = 0;
        }
    }
    if (cl->sd.leaf_pair) return 0;
    for (int c = 0; c < t->n; ++c) {
        Py_ssize_t Sc = cl->S[t->pos[c]];
        t->back[c] = PyMem_Malloc(sizeof(double) * 2 * (S0 * Sc > 0 ? S0 * Sc : 1));
        if (!t->back[c]) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t su = 0; su < S0; ++su)
            for (Py_ssize_t sv = 0; sv < Sc; ++sv)
                for (int i = 0; i < 2; ++i) {
                    const double *g = cl->ext[0] + (su * 2 + i) * 4, *e = cl->ext[t->pos[c]] + (sv * 2 + i) * 4;
                    t->back[c][(su * Sc + sv) * 2 + i] = backward_extent(g[2], g[3], e[2], e[3]);
                }
    }
    return 0;
}

/* closed_form from the consumer tables. */
static inline double closed_form_split(const Call *cl, const Tensor *t, const Py_ssize_t *st, int i) {
    Py_ssize_t off = 0;
    for (int c = 0; c < t->n; ++c) off += st[t->pos[c]] * t->ustr[c];
    const double *u = t->uni + (off * 2 + i) * 4, *g = cl->ext[0] + (st[0] * 2 + i) * 4;
    double moved = t->fwd * forward_extent(u[0], u[1], g[0], g[1]);
    if (cl->sd.leaf_pair) return moved + backward_extent(g[2], g[3], u[2], u[3]);
    for (int c = 0; c < t->n; ++c) moved = moved + t->back[c][(st[0] * cl->S[t->pos[c]] + st[t->pos[c]]) * 2 + i];
    return moved;
}

/* Precompute each tensor's amounts over its own members' states where that is fewer cells than
 * the grid (a tensor read by one of several consumers depends on two of the scope's axes only). */
static int precompute(Call *cl) {
    for (int x = 0; x < cl->nt; ++x) {
        Tensor *t = &cl->ts[x];
        Py_ssize_t n = capped_product(cl->S[0], cl, t);
        if (n >= cl->cells || n > (1 << 24)) {
            if (!t->region && t->n >= 2 && split_consumers(cl, t) < 0) return -1;
            continue;
        }
        t->pre = PyMem_Malloc(sizeof(double) * 2 * (n ? n : 1));
        if (!t->pre) { PyErr_NoMemory(); return -1; }
        t->npre = n;
        t->pstr[t->n] = 1;
        for (int c = t->n - 1; c >= 0; --c) t->pstr[c] = t->pstr[c + 1] * cl->S[t->pos[c]];
        Py_ssize_t st[MAXK], mi[MAXK + 1];
        memset(mi, 0, sizeof(mi));
        for (Py_ssize_t off = 0; off < n; ++off) {
            st[0] = mi[0];
            for (int c = 0; c < t->n; ++c) st[t->pos[c]] = mi[c + 1];
            for (int i = 0; i < 2; ++i) t->pre[i * n + off] = tensor_moved(cl, t, st, i);
            for (int c = t->n; c >= 0; --c) {
                if (++mi[c] < (c ? cl->S[t->pos[c - 1]] : cl->S[0])) break;
                mi[c] = 0;
            }
        }
    }
    return 0;
}

/* Parse relayout's / values' common arguments into `cl` (0, or -1 with an exception set). */
static int call_parse(Call *cl, PyObject *tables, PyObject *indices, PyObject *strides, PyObject *shape,
                      Py_buffer *spec, PyObject *side_t) {
    memset(cl, 0, sizeof(*cl));
    int k = (int)PyTuple_GET_SIZE(tables), nd = (int)PyTuple_GET_SIZE(shape);
    if (k < 1 || k > MAXK || PyTuple_GET_SIZE(indices) != k || nd > MAXD ||
        PyTuple_GET_SIZE(strides) != (Py_ssize_t)k * nd || PyTuple_GET_SIZE(side_t) != 8) {
        PyErr_SetString(PyExc_ValueError, "relayout: inconsistent arguments");
        return -1;
    }
    cl->nd = nd;
    cl->cells = 1;
    for (int d = 0; d < nd; ++d) {
        cl->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        cl->cells *= cl->dims[d];
    }
    for (int j = 0; j < k; ++j) {
        Py_buffer *v = &cl->views[cl->nviews];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tables, j), v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
        ++cl->nviews;
        if (v->itemsize != 8 || v->len % (8 * NF)) {
            PyErr_SetString(PyExc_ValueError, "relayout: a table is not float64 (NF, S)");
            return -1;
        }
        cl->tabs[j] = v->buf;
        cl->S[j] = v->len / (8 * NF);
        v = &cl->views[cl->nviews];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(indices, j), v, PyBUF_C_CONTIGUOUS) < 0) return -1;
        ++cl->nviews;
        if (v->itemsize != 8) {
            PyErr_SetString(PyExc_ValueError, "relayout: indices must be int64");
            return -1;
        }
        cl->idx[j] = v->buf;
        cl->ilen[j] = v->len / 8;
        for (int d = 0; d < nd; ++d) cl->str[j][d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, j * nd + d));
        cl->k = j + 1;
        cl->ext[j] = extents(cl->tabs[j], cl->S[j], j == 0);
        if (!cl->ext[j]) { PyErr_NoMemory(); return -1; }
    }
    double v[8];
    for (int x = 0; x < 8; ++x) v[x] = PyFloat_AsDouble(PyTuple_GET_ITEM(side_t, x));
    if (PyErr_Occurred()) return -1;
    cl->sd = (Side){v[0], {v[1], v[2]}, v[3], (long)v[4], (long)v[5], v[6] != 0.0, v[7] != 0.0, {v[0] / v[1], v[0] / v[2]}};
    const double *sp = spec->buf;
    Py_ssize_t nsp = spec->len / 8, at = 1;
    if (spec->len % 8) goto bad;
    cl->nt = nsp ? (int)sp[0] : 0;
    if (cl->nt < 0) goto bad;
    cl->ts = cl->nt ? PyMem_Calloc(cl->nt, sizeof(Tensor)) : NULL;
    if (cl->nt && !cl->ts) { PyErr_NoMemory(); return -1; }
    for (int x = 0; x < cl->nt; ++x) {
        Tensor *t = &cl->ts[x];
        if (at + 4 > nsp) goto bad;
        t->size = sp[at]; t->region = sp[at + 1] != 0.0; t->fwd = sp[at + 2]; t->n = (int)sp[at + 3];
        at += 4;
        if (t->region && t->n > MAXC) {
            PyErr_Format(PyExc_ValueError, "relayout: a tensor read by %d consumers in a lower group's frame "
                         "(the core's region algebra takes at most %d)", t->n, MAXC);
            return -1;
        }
        if (t->n < 1 || t->n > MAXK || at + t->n > nsp) goto bad;
        for (int c = 0; c < t->n; ++c) {
            t->pos[c] = (int)sp[at++];
            if (t->pos[c] < 1 || t->pos[c] >= k) goto bad;
        }
        if (t->region) {
            if (at + 4 * (1 + t->n) > nsp) goto bad;
            t->g = (Rect){sp[at], sp[at + 1], sp[at + 2], sp[at + 3]};
            at += 4;
            for (int c = 0; c < t->n; ++c, at += 4) t->m[c] = (Rect){sp[at], sp[at + 1], sp[at + 2], sp[at + 3]};
        }
    }
    for (int j = 0; j < k; ++j)
        for (int d = 0; d < nd; ++d)
            if (cl->str[j][d] < 0 || (cl->str[j][d] && (cl->dims[d] - 1) * cl->str[j][d] >= cl->ilen[j])) goto bad;
    for (int j = 0; j < k; ++j)
        if (cl->ilen[j] < 1) goto bad;
    return precompute(cl);
bad:
    PyErr_SetString(PyExc_ValueError, "relayout: malformed tensor spec or strides");
    return -1;
}

/* One cell: each side's elements received, seconds of communication, seconds of it that
 * overlap work (section 4.2). */
/* A tensor's amount in one cell where it was not precomputed over its members' states. */
static inline double unprecomputed(const Call *cl, const Tensor *ts, const Py_ssize_t *st, int i) {
    return ts->uni ? closed_form_split(cl, ts, st, i) : tensor_moved(cl, ts, st, i);
}

/* Seconds of side i's weight traffic (w elements, per step) with the split's extra seconds, when
 * it overlaps the work (section 4.2); it depends on the producer's state only. */
static inline double weight_seconds(const Side *sd, int i, double w, double extra) {
    return sd->overlap ? receive_seconds(sd, i, w, w) + extra : 0.0;
}

/* Side i's communication seconds and the part of them that overlaps work, from the elements x it
 * receives (w of them the weight traffic), the extra seconds and weight_seconds' ow. */
static inline void side_seconds(const Side *sd, int i, double x, double w, double extra, double ow, double *comm,
                                double *weight) {
    if (sd->overlap) { /* the weight traffic is its own message, run alongside the work */
        *weight = ow;
        *comm = receive_seconds(sd, i, pmax(x - w, 0.0), 0.0) + ow;
    } else {
        *weight = 0.0;
        *comm = receive_seconds(sd, i, x, w) + extra;
    }
}

static inline void cell(const Call *cl, const Py_ssize_t *st, double *r, double *comm, double *weight) {
    const double *tu = cl->tabs[0];
    Py_ssize_t su = st[0], S0 = cl->S[0];
    for (int i = 0; i < 2; ++i) {
        double x = fld(tu, S0, F_INTRA0 + i, su);
        for (int t = 0; t < cl->nt; ++t) {
            const Tensor *ts = &cl->ts[t];
            double moved;
            if (ts->pre) {
                Py_ssize_t off = su * ts->pstr[0];
                for (int c = 0; c < ts->n; ++c) off += st[ts->pos[c]] * ts->pstr[c + 1];
                moved = ts->pre[i * ts->npre + off];
            } else {
                moved = unprecomputed(cl, ts, st, i);
            }
            x = x + ts->size * moved;
        }
        double extra = fld(tu, S0, F_EXTRA, su), w = fld(tu, S0, F_WINTRA0 + i, su);
        r[i] = x;
        side_seconds(&cl->sd, i, x, w, extra, weight_seconds(&cl->sd, i, w, extra), &comm[i], &weight[i]);
    }
}

/* Walk the grid: for every cell, the scope's states, then `fn`. The last axis is the inner loop. */
#define WALK(cl, ...)                                                                                    \
    do {                                                                                                 \
        Py_ssize_t mi_[MAXD], st[MAXK], base_[MAXK], c = 0;                                               \
        int nd_ = (cl)->nd, k_ = (cl)->k;                                                                \
        Py_ssize_t inner_ = nd_ ? (cl)->dims[nd_ - 1] : 1;                                               \
        memset(mi_, 0, sizeof(mi_));                                                                     \
        if ((cl)->cells == 0) break;                                                                     \
        for (;;) {                                                                                       \
            for (int j_ = 0; j_ < k_; ++j_) {                                                            \
                Py_ssize_t off_ = 0;                                                                     \
                for (int d_ = 0; d_ < nd_ - 1; ++d_) off_ += mi_[d_] * (cl)->str[j_][d_];                \
                base_[j_] = off_;                                                                        \
            }                                                                                            \
            for (Py_ssize_t x_ = 0; x_ < inner_; ++x_, ++c) {                                            \
                for (int j_ = 0; j_ < k_; ++j_) {                                                        \
                    st[j_] = (Py_ssize_t)(cl)->idx[j_][base_[j_] + (nd_ ? x_ * (cl)->str[j_][nd_ - 1] : 0)]; \
                    if (st[j_] < 0 || st[j_] >= (cl)->S[j_]) goto bad_state;                             \
                }                                                                                        \
                __VA_ARGS__                                                                              \
            }                                                                                            \
            int d_ = nd_ - 2;                                                                            \
            for (; d_ >= 0; --d_) {                                                                      \
                if (++mi_[d_] < (cl)->dims[d_]) break;                                                   \
                mi_[d_] = 0;                                                                             \
            }                                                                                            \
            if (d_ < 0) break;                                                                           \
        }                                                                                                \
    } while (0)

PyDoc_STRVAR(relayout_doc,
"relayout(tables, indices, strides, shape, tensors, side, out)\n\n"
"Every cell of the grid `shape` of one node's terms (docs/costmodel.md sections 3-4):\n"
"tables: per scope member (the producer first) its packed state table, float64 (NF, S);\n"
"indices: per member an int64 array of state indices, read at strides (one int per member\n"
"and grid dimension, 0 where it does not vary); tensors: float64 [T, then per tensor size,\n"
"region?, forward factor (2: sent again by a recomputed block), n, n positions, and on the\n"
"region path g and n boxes m (x0, x1, y0, y1)]; side:\n"
"(bytes per element, bw_1, bw_2, latency, micro-batches, ZeRO stage, overlap, leaf pair);\n"
"out: float64 (6, cells), written: received_1, received_2, comm_1, comm_2, weight_1, weight_2.");

static PyObject *relayout(PyObject *self, PyObject *args) {
    PyObject *tables, *indices, *strides, *shape, *side_t;
    Py_buffer spec, out;
    Call cl;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O!O!y*O!w*", &PyTuple_Type, &tables, &PyTuple_Type, &indices, &PyTuple_Type,
                          &strides, &PyTuple_Type, &shape, &spec, &PyTuple_Type, &side_t, &out))
        return NULL;
    if (call_parse(&cl, tables, indices, strides, shape, &spec, side_t) < 0) goto done;
    if (out.len < (Py_ssize_t)(6 * 8) * cl.cells) {
        PyErr_SetString(PyExc_ValueError, "relayout: output of the wrong size");
        goto done;
    }
    double *o = out.buf;
    Py_ssize_t n = cl.cells;
    WALK(&cl, {
        double r[2], cm[2], w[2];
        cell(&cl, st, r, cm, w);
        o[c] = r[0]; o[n + c] = r[1]; o[2 * n + c] = cm[0]; o[3 * n + c] = cm[1]; o[4 * n + c] = w[0]; o[5 * n + c] = w[1];
    });
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
bad_state:
    PyErr_SetString(PyExc_IndexError, "relayout: a state index is out of its table");
done:
    call_free(&cl);
    PyBuffer_Release(&spec);
    PyBuffer_Release(&out);
    return result;
}

#define OVERLAP_WINDOW (2.0 / 3.0) /* cost.OVERLAP_WINDOW */

/* A side's time for a node: work + comm - min(weight, OVERLAP_WINDOW * work) (section 4.2). */
static inline double overlap_time(double work, double comm, double weight) {
    return work + comm - pmin(weight, OVERLAP_WINDOW * work);
}

PyDoc_STRVAR(values_doc,
"values(tables, indices, strides, shape, tensors, side, steps, objective, out)\n\n"
"A node's objective value in every cell (cost.node_value without a floor), written to out\n"
"(float64, cells): objective 0 = time, max over the sides of work + comm less what overlaps\n"
"(interval states: the smallest over the K - 1 sub-intervals of max(side 1 at its start,\n"
"side 2 at its end)); 1 = communication, the elements both sides receive. steps: the\n"
"producer's compute seconds, float64 (2, S, K). The other arguments are relayout's.");

/* Whether the call's grid is its members' whole state ranges in scope order (node_factor's full
 * tables): member j's state is the grid's axis j. */
static int full_grid(const Call *cl) {
    if (cl->nd != cl->k || cl->k < 2) return 0;
    for (int j = 0; j < cl->k; ++j) {
        if (cl->dims[j] != cl->S[j] || cl->ilen[j] != cl->S[j]) return 0;
        for (int d = 0; d < cl->nd; ++d)
            if (cl->str[j][d] != ((d == j && cl->S[j] > 1) ? 1 : 0)) return 0;
        for (Py_ssize_t x = 0; x < cl->S[j]; ++x)
            if (cl->idx[j][x] != x) return 0;
    }
    return 1;
}

/* values() over a full grid of point states (K == 1): cell()'s terms (the same helpers, in the same
 * order), with the producer's fields, its weight traffic's seconds and each precomputed tensor's
 * offset read once per row of the last axis instead of once per cell. A tensor of several
 * consumers priced from its consumer tables (Tensor.uni; a fork's, whose table is the whole
 * grid) has its row's addresses and the backward amounts of its consumers off the last axis
 * read once per row too (FAST_T tensors of FAST_C consumers at most; closed_form_split's
 * operations, in its order). */
#define FAST_T 8
#define FAST_C 8
static void values_full(const Call *cl, const double *s1, const double *s2, int objective, double *o) {
    int k = cl->k, nt = cl->nt, leaf = cl->sd.leaf_pair;
    const double *tu = cl->tabs[0];
    Py_ssize_t S0 = cl->S[0], last = cl->S[k - 1], st[MAXK], base[MAXK], lstr[MAXK], c = 0;
    /* per uni tensor: which of its consumers is on the last axis (-1: none), the row's consumer
     * table base and step along the last axis, its backward amounts per consumer and side (the
     * last axis's: a pointer, stepped along the row) */
    int ulast[FAST_T], fast = nt <= FAST_T;
    const double *ubase[FAST_T], *bptr[FAST_T][2];
    Py_ssize_t ustep[FAST_T];
    double bconst[FAST_T][FAST_C][2];
    memset(st, 0, sizeof(st));
    int all_pre = 1;
    for (int t = 0; t < nt; ++t) all_pre &= cl->ts[t].pre != NULL;
    double *rows = all_pre ? PyMem_Malloc(sizeof(double) * 2 * (size_t)(last ? last : 1)) : NULL;
    for (int t = 0; t < nt; ++t) {
        const Tensor *ts = &cl->ts[t];
        lstr[t] = 0;
        if (ts->pre)
            for (int x = 0; x < ts->n; ++x)
                if (ts->pos[x] == k - 1) lstr[t] = ts->pstr[x + 1];
        if (!fast || ts->pre) continue;
        if (!ts->uni || ts->n > FAST_C) { fast = 0; continue; }
        ulast[t] = -1;
        for (int x = 0; x < ts->n; ++x)
            if (ts->pos[x] == k - 1) ulast[t] = x;
        ustep[t] = ulast[t] >= 0 ? ts->ustr[ulast[t]] * 8 : 0;
    }
    for (;;) {
        Py_ssize_t su = st[0];
        double in0 = fld(tu, S0, F_INTRA0, su), in1 = fld(tu, S0, F_INTRA1, su), ext = fld(tu, S0, F_EXTRA, su);
        double w0 = fld(tu, S0, F_WINTRA0, su), w1 = fld(tu, S0, F_WINTRA1, su), t1 = s1[su], t2 = s2[su];
        double ow0 = weight_seconds(&cl->sd, 0, w0, ext), ow1 = weight_seconds(&cl->sd, 1, w1, ext);
        const double *g = cl->ext[0] + su * 8; /* side i's producer extents: g + i * 4 */
        for (int t = 0; t < nt; ++t) {
            const Tensor *ts = &cl->ts[t];
            if (ts->pre) {
                Py_ssize_t off = su * ts->pstr[0];
                for (int x = 0; x < ts->n; ++x)
                    if (ts->pos[x] != k - 1) off += st[ts->pos[x]] * ts->pstr[x + 1];
                base[t] = off;
            } else if (fast) {
                Py_ssize_t off = 0;
                for (int x = 0; x < ts->n; ++x)
                    if (x != ulast[t]) off += st[ts->pos[x]] * ts->ustr[x];
                ubase[t] = ts->uni + off * 8;
                if (leaf) continue;
                for (int x = 0; x < ts->n; ++x) {
                    Py_ssize_t Sc = cl->S[ts->pos[x]];
                    if (x == ulast[t]) {
                        for (int i = 0; i < 2; ++i) bptr[t][i] = ts->back[x] + su * Sc * 2 + i;
                    } else {
                        for (int i = 0; i < 2; ++i) bconst[t][x][i] = ts->back[x][(su * Sc + st[ts->pos[x]]) * 2 + i];
                    }
                }
            }
        }
        if (rows) { /* every tensor precomputed: a row's amounts added tensor by tensor */
            for (int i = 0; i < 2; ++i) {
                double *x = rows + i * last, in = i ? in1 : in0;
                for (Py_ssize_t xl = 0; xl < last; ++xl) x[xl] = in;
                for (int t = 0; t < nt; ++t) {
                    const Tensor *ts = &cl->ts[t];
                    const double *restrict p = ts->pre + i * ts->npre + base[t];
                    double sz = ts->size;
                    Py_ssize_t ls = lstr[t];
                    if (ls == 1) {
                        for (Py_ssize_t xl = 0; xl < last; ++xl) x[xl] = x[xl] + sz * p[xl];
                    } else if (ls == 0) {
                        double m = sz * p[0];
                        for (Py_ssize_t xl = 0; xl < last; ++xl) x[xl] = x[xl] + m;
                    } else {
                        for (Py_ssize_t xl = 0; xl < last; ++xl) x[xl] = x[xl] + sz * p[xl * ls];
                    }
                }
            }
            const double *x0 = rows, *x1 = rows + last;
            for (Py_ssize_t xl = 0; xl < last; ++xl, ++c) {
                double cm0, cm1, wt0, wt1;
                side_seconds(&cl->sd, 0, x0[xl], w0, ext, ow0, &cm0, &wt0);
                side_seconds(&cl->sd, 1, x1[xl], w1, ext, ow1, &cm1, &wt1);
                o[c] = objective == 1 ? x0[xl] + x1[xl] : pmax(overlap_time(t1, cm0, wt0), overlap_time(t2, cm1, wt1));
            }
        } else
        for (Py_ssize_t xl = 0; xl < last; ++xl, ++c) {
            double r[2], cm[2], wt[2];
            st[k - 1] = xl;
            for (int i = 0; i < 2; ++i) {
                double x = i ? in1 : in0;
                for (int t = 0; t < nt; ++t) {
                    const Tensor *ts = &cl->ts[t];
                    double moved;
                    if (ts->pre) {
                        moved = ts->pre[i * ts->npre + base[t] + xl * lstr[t]];
                    } else if (fast) { /* closed_form_split */
                        const double *u = ubase[t] + xl * ustep[t] + i * 4, *gi = g + i * 4;
                        moved = ts->fwd * forward_extent(u[0], u[1], gi[0], gi[1]);
                        if (leaf) {
                            moved = moved + backward_extent(gi[2], gi[3], u[2], u[3]);
                        } else {
                            for (int y = 0; y < ts->n; ++y)
                                moved = moved + (y == ulast[t] ? bptr[t][i][xl * 2] : bconst[t][y][i]);
                        }
                    } else {
                        moved = unprecomputed(cl, ts, st, i);
                    }
                    x = x + ts->size * moved;
                }
                r[i] = x;
                side_seconds(&cl->sd, i, x, i ? w1 : w0, ext, i ? ow1 : ow0, &cm[i], &wt[i]);
            }
            o[c] = objective == 1 ? r[0] + r[1] : pmax(overlap_time(t1, cm[0], wt[0]), overlap_time(t2, cm[1], wt[1]));
        }
        int d = k - 2;
        for (; d >= 0; --d) {
            if (++st[d] < cl->S[d]) break;
            st[d] = 0;
        }
        if (d < 0) break;
    }
    PyMem_Free(rows);
}

static PyObject *values(PyObject *self, PyObject *args) {
    PyObject *tables, *indices, *strides, *shape, *side_t;
    Py_buffer spec, steps, out;
    int objective;
    Call cl;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O!O!y*O!y*iw*", &PyTuple_Type, &tables, &PyTuple_Type, &indices, &PyTuple_Type,
                          &strides, &PyTuple_Type, &shape, &spec, &PyTuple_Type, &side_t, &steps, &objective, &out))
        return NULL;
    if (call_parse(&cl, tables, indices, strides, shape, &spec, side_t) < 0) goto done;
    Py_ssize_t S0 = cl.S[0], K = S0 ? steps.len / (8 * 2 * S0) : 1;
    if (out.len < (Py_ssize_t)8 * cl.cells || K < 1 || steps.len != (Py_ssize_t)8 * 2 * S0 * K) {
        PyErr_SetString(PyExc_ValueError, "values: output or steps of the wrong size");
        goto done;
    }
    double *o = out.buf;
    const double *s1 = steps.buf, *s2 = (const double *)steps.buf + S0 * K;
    if (K == 1 && cl.cells > 0 && full_grid(&cl)) {
        values_full(&cl, s1, s2, objective, o);
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    WALK(&cl, {
        double r[2], cm[2], w[2];
        cell(&cl, st, r, cm, w);
        Py_ssize_t su = st[0];
        if (objective == 1) {
            o[c] = r[0] + r[1];
        } else if (K == 1) {
            o[c] = pmax(overlap_time(s1[su], cm[0], w[0]), overlap_time(s2[su], cm[1], w[1]));
        } else { /* side 1's compute grows and side 2's shrinks with the share */
            double best = 0.0;
            for (Py_ssize_t q = 0; q + 1 < K; ++q) {
                double t = pmax(overlap_time(s1[su * K + q], cm[0], w[0]), overlap_time(s2[su * K + q + 1], cm[1], w[1]));
                best = q == 0 ? t : pmin(best, t);
            }
            o[c] = best;
        }
    });
    Py_INCREF(Py_None);
    result = Py_None;
    goto done;
bad_state:
    PyErr_SetString(PyExc_IndexError, "values: a state index is out of its table");
done:
    call_free(&cl);
    PyBuffer_Release(&spec);
    PyBuffer_Release(&steps);
    PyBuffer_Release(&out);
    return result;
}

#define REL_TOL 1e-12 /* cost.REL_TOL: ties */
#define FLOOR_TIE_WEIGHT 1e-6 /* cost.FLOOR_TIE_WEIGHT */

/* A node's time v under its sibling's floor f > 0 (cost.floored_time): max(v, f) + FLOOR_TIE_WEIGHT v. */
static inline double floor_value(double v, double f) { return (v < f ? f : v) + FLOOR_TIE_WEIGHT * v * 1.0; }

/* The elimination step over the grid `dims` (nd axes) of nt tables (element strides str[t * nd +
 * d], floors as eliminate's): best and arg over the grid without `axis`. -1: out of memory. */
static int elim_core(int nt, const double *const *tabs, const Py_ssize_t *str, const double *floors, int nd,
                     const Py_ssize_t *dims, int axis, double *best, long long *arg) {
    Py_ssize_t rest = 1, n = dims[axis];
    for (int d = 0; d < nd; ++d)
        if (d != axis) rest *= dims[d];
    /* blocks of the grid without the axis along its last dimension `ld` (L cells): the block's
     * sums for every state of the axis, acc[x * L + j], added table by table in the order given,
     * so each cell's sum is the one a cell-by-cell walk makes; the inner loops run along the
     * block (contiguous in a table whose last axis is ld) */
    int ld = -1;
    for (int d = nd - 1; d >= 0 && ld < 0; --d)
        if (d != axis) ld = d;
    Py_ssize_t L = ld >= 0 ? dims[ld] : 1;
    double *tot = PyMem_Malloc(sizeof(double) * (size_t)(n * L + L));
    if (!tot) return -1;
    double *acc = tot, *bb = tot + n * L;
    Py_ssize_t mi[MAXD];
    memset(mi, 0, sizeof(mi));
    for (Py_ssize_t r0 = 0; r0 < rest; r0 += L) {
        for (Py_ssize_t q = 0; q < n * L; ++q) acc[q] = 0.0;
        for (int t = 0; t < nt; ++t) {
            const double *tab = tabs[t];
            Py_ssize_t off = 0, sa = str[t * nd + axis], sl = ld >= 0 ? str[t * nd + ld] : 0;
            for (int d = 0; d < nd; ++d) off += mi[d] * str[t * nd + d];
            double f = floors[t];
            for (Py_ssize_t x = 0; x < n; ++x) {
                const double *restrict src = tab + off + x * sa;
                double *restrict dst = acc + x * L;
                if (f > 0.0) { /* floored()'s values, read on the fly */
                    for (Py_ssize_t j = 0; j < L; ++j) dst[j] = dst[j] + floor_value(src[j * sl], f);
                } else if (sl == 1) {
                    for (Py_ssize_t j = 0; j < L; ++j) dst[j] = dst[j] + src[j];
                } else if (sl == 0) {
                    double v = src[0];
                    for (Py_ssize_t j = 0; j < L; ++j) dst[j] = dst[j] + v;
                } else {
                    for (Py_ssize_t j = 0; j < L; ++j) dst[j] = dst[j] + src[j * sl];
                }
            }
        }
        for (Py_ssize_t j = 0; j < L; ++j) bb[j] = acc[j];
        for (Py_ssize_t x = 1; x < n; ++x) {
            const double *row = acc + x * L;
            for (Py_ssize_t j = 0; j < L; ++j) bb[j] = row[j] < bb[j] ? row[j] : bb[j];
        }
        /* numpy's argmax of the tie mask: the first state within it, else 0 (each cell's scan
         * stops at its first state within the tie, most often the first few) */
        for (Py_ssize_t j = 0; j < L; ++j) {
            double b = bb[j], l = b + REL_TOL * (b < 0 ? -b : b);
            long long a = 0;
            for (Py_ssize_t x = 0; x < n; ++x)
                if (acc[x * L + j] <= l) {
                    a = x;
                    break;
                }
            best[r0 + j] = b;
            arg[r0 + j] = a;
        }
        for (int d = nd - 1; d >= 0; --d) { /* the next block */
            if (d == axis || d == ld) continue;
            if (++mi[d] < dims[d]) break;
            mi[d] = 0;
        }
    }
    PyMem_Free(tot);
    return 0;
}

PyDoc_STRVAR(eliminate_doc,
"eliminate(tables, strides, shape, axis, best, arg)\n\n"
"One step of the DP's variable elimination (docs/costmodel.md section 8): over the joint grid\n"
"`shape` of the tables that mention the eliminated node (its axis `axis`), their sum (added in\n"
"the order given, from 0.0), its minimum over `axis` written to best (float64, the grid\n"
"without that axis) and the first state within REL_TOL of it to arg (int64, same shape).\n"
"tables: contiguous float64 arrays; strides: per table one element stride per grid\n"
"dimension (0 where the table does not vary). The DP's own steps run in solve().");

static PyObject *eliminate(PyObject *self, PyObject *args) {
    PyObject *tables, *strides, *shape;
    int axis;
    Py_buffer bestv, argv;
    if (!PyArg_ParseTuple(args, "O!O!O!iw*w*", &PyTuple_Type, &tables, &PyTuple_Type, &strides, &PyTuple_Type,
                          &shape, &axis, &bestv, &argv))
        return NULL;
    PyObject *result = NULL;
    int nt = (int)PyTuple_GET_SIZE(tables), nd = (int)PyTuple_GET_SIZE(shape), got = 0;
    Py_buffer *views = PyMem_Calloc(nt ? nt : 1, sizeof(Py_buffer));
    Py_ssize_t *str = PyMem_Calloc((size_t)(nt ? nt : 1) * (nd ? nd : 1), sizeof(Py_ssize_t));
    double *floors = PyMem_Calloc(nt ? nt : 1, sizeof(double)); /* none: every table as it is */
    Py_ssize_t dims[MAXD], rest = 1;
    if (!views || !str || !floors) { PyErr_NoMemory(); goto done; }
    if (nd < 1 || nd > MAXD || axis < 0 || axis >= nd || PyTuple_GET_SIZE(strides) != (Py_ssize_t)nt * nd) {
        PyErr_SetString(PyExc_ValueError, "eliminate: inconsistent arguments");
        goto done;
    }
    for (int d = 0; d < nd; ++d) {
        dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dims[d] < 1) { PyErr_SetString(PyExc_ValueError, "eliminate: empty grid"); goto done; }
        if (d != axis) rest *= dims[d];
    }
    for (int t = 0; t < nt; ++t) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tables, t), &views[t], PyBUF_C_CONTIGUOUS) < 0) goto done;
        ++got;
        Py_ssize_t reach = 0;
        for (int d = 0; d < nd; ++d) {
            str[t * nd + d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, t * nd + d));
            if (str[t * nd + d] < 0) { PyErr_SetString(PyExc_ValueError, "eliminate: negative stride"); goto done; }
            reach += (dims[d] - 1) * str[t * nd + d];
        }
        if (views[t].itemsize != 8 || reach >= views[t].len / 8) {
            PyErr_SetString(PyExc_ValueError, "eliminate: a table is smaller than its strides reach");
            goto done;
        }
    }
    if (PyErr_Occurred()) goto done;
    if (bestv.len < rest * 8 || argv.len < rest * 8) {
        PyErr_SetString(PyExc_ValueError, "eliminate: outputs of the wrong size");
        goto done;
    }
    const double **tabs = PyMem_Calloc(nt ? nt : 1, sizeof(double *));
    if (!tabs) { PyErr_NoMemory(); goto done; }
    for (int t = 0; t < nt; ++t) tabs[t] = views[t].buf;
    if (elim_core(nt, tabs, str, floors, nd, dims, axis, bestv.buf, argv.buf) < 0) PyErr_NoMemory();
    PyMem_Free(tabs);
    if (PyErr_Occurred()) goto done;
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int t = 0; t < got; ++t) PyBuffer_Release(&views[t]);
    PyMem_Free(views);
    PyMem_Free(str);
    PyMem_Free(floors);
    PyBuffer_Release(&bestv);
    PyBuffer_Release(&argv);
    return result;
}

/* ---- the whole elimination of one DP (dp.min_states) ----------------------------------------- */

typedef struct {
    int k, alive;
    int vars[MAXD];
    const double *data;
    double *owned; /* a message's table (freed when consumed); NULL for a factor (a buffer view) */
    double floor;
} Factor;

typedef struct {
    int v, k;
    int vars[MAXD];
    long long *arg;
} Record;

PyDoc_STRVAR(solve_doc,
"solve(scopes, tables, floors, sizes, order, max_cells) -> (value, states) | (None, v, cells)\n\n"
"dp.min_states' variable elimination in one call (docs/costmodel.md section 8): the factors\n"
"(per node u its scope tuple, its table: a C-contiguous float64 array over the scope in that\n"
"order, and its floor as eliminate's), the nodes' state counts `sizes`, the elimination\n"
"order. Each step sums the live tables that mention the node in the order they were made\n"
"(the factors first, then the messages), as eliminate() does, and keeps the minimum over the\n"
"node and its first state within REL_TOL. Returns the least objective and each node's state,\n"
"or (None, v, cells) where node v's step would need more than max_cells cells.");

static PyObject *solve(PyObject *self, PyObject *args) {
    PyObject *scopes, *tables, *floors_t, *sizes_t, *order_t;
    double max_cells;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!d", &PyTuple_Type, &scopes, &PyTuple_Type, &tables, &PyTuple_Type,
                          &floors_t, &PyTuple_Type, &sizes_t, &PyTuple_Type, &order_t, &max_cells))
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(scopes), n = PyTuple_GET_SIZE(sizes_t), no = PyTuple_GET_SIZE(order_t);
    if (PyTuple_GET_SIZE(tables) != nf || PyTuple_GET_SIZE(floors_t) != nf) {
        PyErr_SetString(PyExc_ValueError, "solve: scopes, tables and floors differ in length");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t cap = nf + no + 1, nfac = 0, nrec = 0, got = 0;
    Factor *fs = PyMem_Calloc((size_t)cap, sizeof(Factor));
    Record *rs = PyMem_Calloc((size_t)(no ? no : 1), sizeof(Record));
    Py_buffer *views = PyMem_Calloc((size_t)(nf ? nf : 1), sizeof(Py_buffer));
    Py_ssize_t *size = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    /* per node, the ids of the factors that mention it, in the order they were made */
    Py_ssize_t **ment = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t *));
    Py_ssize_t *nment = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    Py_ssize_t *capm = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    long long *state = PyMem_Calloc((size_t)(n ? n : 1), sizeof(long long));
    Py_ssize_t *mark = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t)); /* step + 1 a node was seen */
    if (!fs || !rs || !views || !size || !ment || !nment || !capm || !state || !mark) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t v = 0; v < n; ++v) {
        size[v] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes_t, v));
        if (size[v] < 1) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "solve: a node without states");
            goto done;
        }
    }
#define MENTION(w, id)                                                                              \
    do {                                                                                            \
        if (nment[w] == capm[w]) {                                                                  \
            Py_ssize_t c2_ = capm[w] ? 2 * capm[w] : 4;                                             \
            Py_ssize_t *m2_ = PyMem_Realloc(ment[w], sizeof(Py_ssize_t) * (size_t)c2_);             \
            if (!m2_) { PyErr_NoMemory(); goto done; }                                              \
            ment[w] = m2_;                                                                          \
            capm[w] = c2_;                                                                          \
        }                                                                                           \
        ment[w][nment[w]++] = (id);                                                                 \
    } while (0)
    for (Py_ssize_t u = 0; u < nf; ++u) {
        PyObject *sc = PyTuple_GET_ITEM(scopes, u);
        if (!PyTuple_Check(sc) || PyTuple_GET_SIZE(sc) > MAXD) {
            PyErr_SetString(PyExc_ValueError, "solve: a scope is not a tuple of at most 32 nodes");
            goto done;
        }
        Factor *f = &fs[nfac];
        f->k = (int)PyTuple_GET_SIZE(sc);
        Py_ssize_t cells = 1;
        for (int j = 0; j < f->k; ++j) {
            long w = PyLong_AsLong(PyTuple_GET_ITEM(sc, j));
            if (w < 0 || w >= n) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "solve: a scope names no node");
                goto done;
            }
            f->vars[j] = (int)w;
            cells *= size[w];
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tables, u), &views[u], PyBUF_C_CONTIGUOUS) < 0) goto done;
        got = u + 1;
        if (views[u].itemsize != 8 || views[u].len != cells * 8) {
            PyErr_SetString(PyExc_ValueError, "solve: a table does not match its scope's sizes");
            goto done;
        }
        f->data = views[u].buf;
        f->floor = PyFloat_AsDouble(PyTuple_GET_ITEM(floors_t, u));
        if (f->floor == -1.0 && PyErr_Occurred()) goto done;
        if (!(f->floor > 0.0)) f->floor = 0.0;
        f->alive = 1;
        for (int j = 0; j < f->k; ++j) MENTION(f->vars[j], nfac);
        ++nfac;
    }
    double constant = 0.0;
    for (Py_ssize_t o = 0; o < no; ++o) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(order_t, o));
        if (v < 0 || v >= n) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "solve: the order names no node");
            goto done;
        }
        /* the clique: the live tables that mention v (in the order made) and their nodes, sorted */
        Py_ssize_t *mine = ment[v], nm = 0; /* compacted in place: the live ones */
        int in_scope[MAXD], ns = 0, wide = 0;
        double cells = 1.0;
        for (Py_ssize_t q = 0; q < nment[v]; ++q) {
            Py_ssize_t id = ment[v][q];
            if (!fs[id].alive) continue;
            mine[nm++] = id;
            for (int j = 0; j < fs[id].k; ++j) {
                int w = fs[id].vars[j];
                if (mark[w] == o + 1) continue;
                mark[w] = o + 1; /* in this step's scope */
                cells *= (double)size[w];
                if (ns == MAXD)
                    wide = 1; /* counted, not kept: the step is refused below */
                else
                    in_scope[ns++] = w;
            }
        }
        nment[v] = 0;
        if (nm == 0) continue; /* a node no table mentions (none: each node has its own factor) */
        if (cells > max_cells) {
            result = Py_BuildValue("(Old)", Py_None, v, cells);
            goto done;
        }
        if (wide) {
            PyErr_SetString(PyExc_ValueError, "solve: a step spans more than 32 nodes");
            goto done;
        }
        for (int x = 1; x < ns; ++x) { /* sort the scope */
            int w = in_scope[x], y = x - 1;
            while (y >= 0 && in_scope[y] > w) { in_scope[y + 1] = in_scope[y]; --y; }
            in_scope[y + 1] = w;
        }
        Py_ssize_t dims[MAXD];
        int axis = 0;
        for (int x = 0; x < ns; ++x) {
            dims[x] = size[in_scope[x]];
            if (in_scope[x] == v) axis = x;
        }
        /* each table's element stride per axis of the clique (C order over its own scope) */
        Py_ssize_t *str = PyMem_Calloc((size_t)nm * (size_t)ns, sizeof(Py_ssize_t));
        const double **tabs = PyMem_Calloc((size_t)nm, sizeof(double *));
        double *fl = PyMem_Calloc((size_t)nm, sizeof(double));
        if (!str || !tabs || !fl) {
            PyMem_Free(str); PyMem_Free(tabs); PyMem_Free(fl);
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t t = 0; t < nm; ++t) {
            Factor *f = &fs[mine[t]];
            Py_ssize_t step = 1;
            for (int j = f->k - 1; j >= 0; --j) {
                int w = f->vars[j], x = 0;
                while (in_scope[x] != w) ++x;
                str[t * ns + x] = size[w] > 1 ? step : 0;
                step *= size[w];
            }
            tabs[t] = f->data;
            fl[t] = f->floor;
        }
        Py_ssize_t rest = 1;
        for (int x = 0; x < ns; ++x)
            if (x != axis) rest *= dims[x];
        double *best = PyMem_Malloc(sizeof(double) * (size_t)rest);
        long long *arg = PyMem_Malloc(sizeof(long long) * (size_t)rest);
        int bad = !best || !arg || elim_core((int)nm, tabs, str, fl, ns, dims, axis, best, arg) < 0;
        PyMem_Free(str); PyMem_Free(tabs); PyMem_Free(fl);
        if (bad) { PyMem_Free(best); PyMem_Free(arg); PyErr_NoMemory(); goto done; }
        for (Py_ssize_t t = 0; t < nm; ++t) { /* the consumed tables */
            Factor *f = &fs[mine[t]];
            f->alive = 0;
            PyMem_Free(f->owned);
            f->owned = NULL;
            f->data = NULL;
        }
        Record *r = &rs[nrec++];
        r->v = (int)v;
        r->k = 0;
        r->arg = arg;
        for (int x = 0; x < ns; ++x)
            if (x != axis) r->vars[r->k++] = in_scope[x];
        if (r->k) { /* the message: a new live table over the rest (counted first: freed at done) */
            Py_ssize_t id = nfac++;
            Factor *m = &fs[id];
            m->k = r->k;
            memcpy(m->vars, r->vars, sizeof(int) * (size_t)r->k);
            m->data = m->owned = best;
            m->floor = 0.0;
            m->alive = 1;
            for (int j = 0; j < m->k; ++j) MENTION(m->vars[j], id);
        } else {
            constant += best[0];
            PyMem_Free(best);
        }
    }
#undef MENTION
    double value = constant;
    for (Py_ssize_t id = 0; id < nfac; ++id) /* tables over no node (none in practice) */
        if (fs[id].alive && fs[id].k == 0) value += fs[id].data[0];
    for (Py_ssize_t q = nrec - 1; q >= 0; --q) {
        Record *r = &rs[q];
        Py_ssize_t off = 0;
        for (int j = 0; j < r->k; ++j) off = off * size[r->vars[j]] + (Py_ssize_t)state[r->vars[j]];
        state[r->v] = r->arg[off];
    }
    PyObject *states = PyList_New(n);
    if (!states) goto done;
    for (Py_ssize_t v = 0; v < n; ++v) PyList_SET_ITEM(states, v, PyLong_FromLongLong(state[v]));
    result = Py_BuildValue("(dN)", value, states);
done:
    if (fs)
        for (Py_ssize_t id = 0; id < nfac; ++id) PyMem_Free(fs[id].owned);
    if (rs)
        for (Py_ssize_t q = 0; q < nrec; ++q) PyMem_Free(rs[q].arg);
    for (Py_ssize_t u = 0; u < got; ++u) PyBuffer_Release(&views[u]);
    if (ment)
        for (Py_ssize_t v = 0; v < n; ++v) PyMem_Free(ment[v]);
    PyMem_Free(fs); PyMem_Free(rs); PyMem_Free(views); PyMem_Free(size);
    PyMem_Free(ment); PyMem_Free(nment); PyMem_Free(capm); PyMem_Free(state); PyMem_Free(mark);
    return result;
}

/* ---- compute and memory of a layer's part (sections 1, 5, 6) -------------------------------- */

#define WEIGHTED_TRAFFIC 3.0        /* dims.WEIGHTED_TRAFFIC */
#define FORWARD_FLOPS (1.0 / 3.0)   /* dims.FORWARD_FLOPS */
#define FORWARD_OP_TRAFFIC 0.5      /* dims.FORWARD_OP_TRAFFIC */
enum { K_GEMM, K_CONV, K_ATTENTION };

/* A device as the time formula sees it (dims.Device); conv / attention efficiency NaN = None. */
typedef struct {
    double flops, mem_bw, eff, conv_eff, attn_eff, mem_eff, t0;
} Dev;

/* An element-wise op per element (dims.ElementOp). */
typedef struct {
    double flops, traffic, stored, row_exchange;
    int kind;
} Op;

#define MAXOPS 64
#define DIMS_FIELDS 14
/* A layer's sizes at one group (dims.LayerDims). */
typedef struct {
    double batch, in_f, out_f, in_sp, out_sp, kernel, groups, tables, experts, active, replica;
    double ckpt; /* dims.LayerDims.checkpoint: < 0 the product's input, else that part of the input */
    int recompute;
    long micro;
    int n_out, n_in;
    const Op *out_ops, *in_ops; /* held by the caller (OpStore) */
} Dims;

typedef struct {
    Op out[MAXOPS], in[MAXOPS];
} OpStore;

static inline double efficiency_of(const Dev *d, int kind) {
    if (kind == K_CONV && d->conv_eff == d->conv_eff) return d->conv_eff;
    if (kind == K_ATTENTION && d->attn_eff == d->attn_eff) return d->attn_eff;
    return d->eff;
}

/* max(FLOPs / (e_kind peak), bytes / (m HBM), kernels t0): the roofline with a launch roof. */
static double roofline(double flops, double traffic, const Dev *d, int kind, long kernels) {
    double t = pmax(flops / (efficiency_of(d, kind) * d->flops), traffic / (d->mem_eff * d->mem_bw));
    return (kernels && (flops > 0 || traffic > 0)) ? pmax(t, (double)kernels * d->t0) : t;
}

/* Training time of an element-wise op on `size` units (forward and backward kernel per
 * micro-batch; its forward again under recomputation). */
static double op_seconds(const Op *op, double size, const Dev *d, double bpe, long m, int recompute) {
    int kind = op->kind == K_ATTENTION ? K_ATTENTION : K_GEMM;
    double t = roofline(size * op->flops, size * op->traffic * bpe, d, kind, 2 * m);
    if (recompute)
        t += roofline(size * op->flops * FORWARD_FLOPS, size * op->traffic * FORWARD_OP_TRAFFIC * bpe, d, kind, m);
    return t;
}

static inline double d_flops(const Dims *x) {
    return 6.0 * x->active * x->batch * x->out_f * x->out_sp * x->in_f * x->kernel / x->groups;
}
static inline double d_in(const Dims *x) { return x->batch * x->in_f * x->in_sp; }
static inline double d_out(const Dims *x) { return x->batch * x->out_f * x->out_sp; }
static inline double d_weight(const Dims *x) {
    return x->experts * x->in_f * x->out_f * x->kernel / x->groups + x->tables * x->in_f;
}
static inline double d_rowx(const Dims *x) {
    double s = 0.0;
    for (int i = 0; i < x->n_out; ++i) s = s + x->out_ops[i].row_exchange;
    return x->batch * s;
}
/* What backward needs of one micro-batch, all of it kept (no recomputation; section 1). */
static double d_stored_all(const Dims *x) {
    double m = (double)x->micro;
    double own = x->kernel != 0.0 ? x->active * d_in(x) : 0.0, so = 0.0, si = 0.0;
    for (int i = 0; i < x->n_out; ++i) so = so + x->out_ops[i].stored;
    for (int i = 0; i < x->n_in; ++i) si = si + x->in_ops[i].stored;
    return (own + d_out(x) * so + d_in(x) * si) / m;
}

/* The activation elements kept between forward and backward: all of them, or under
 * recomputation the checkpoints (section 6.3: the product's input, or in a block the part of the
 * input that comes from outside it). */
static double d_stored(const Dims *x) {
    double m = (double)x->micro;
    if (x->recompute) {
        if (x->ckpt < 0.0) return x->kernel != 0.0 ? d_in(x) / m : 0.0;
        return x->ckpt * d_in(x) / m;
    }
    return d_stored_all(x);
}

/* One training step of these sizes on a device (section 5). */
static double compute_seconds(const Dims *x, const Dev *d, double bpe) {
    double t = 0.0;
    long m = x->micro;
    if (x->kernel != 0.0 && d_flops(x) > 0) {
        double once = x->active * (d_in(x) + d_out(x)) + (double)m * d_weight(x);
        int kind = x->kernel > 1 ? K_CONV : K_GEMM;
        t = roofline(d_flops(x), WEIGHTED_TRAFFIC * once * bpe, d, kind, 3 * m);
        if (x->recompute) t += roofline(d_flops(x) * FORWARD_FLOPS, once * bpe, d, kind, m);
    }
    double size = d_out(x);
    if (size > 0)
        for (int i = 0; i < x->n_out; ++i) t += op_seconds(&x->out_ops[i], size, d, bpe, m, x->recompute);
    size = d_in(x);
    if (size > 0)
        for (int i = 0; i < x->n_in; ++i) t += op_seconds(&x->in_ops[i], size, d, bpe, m, x->recompute);
    return t;
}

/* Bytes a holder of these sizes keeps (section 6; ZeRO stage `zero`, 6.1). */
static double memory_bytes(const Dims *x, double bpe, double opt, long zero) {
    double w = d_weight(x), shard = x->replica;
    double per_param = bpe * (zero >= 3 ? shard : 1.0) + bpe * (zero >= 2 ? shard : 1.0) + opt * (zero >= 1 ? shard : 1.0);
    return w * per_param + d_stored(x) * bpe;
}

/* What ZeRO stage 3 gathers for a layer's part while its unit runs (section 6.1): its weights
 * less the shard it keeps. */
static double gathered_bytes(const Dims *x, double bpe, long zero) {
    return zero >= 3 ? d_weight(x) * bpe * (1.0 - x->replica) : 0.0;
}

/* Choice codes: the three types, then the three join layouts (cost.CHOICE_CODE). */
enum { C_BATCH, C_IN, C_OUT, C_ROWS, C_COLS, C_WHOLE };
static const int GIVE[6] = {0, 2, 1, 0, 1, 2}; /* a choice's output layout (layout.ports) */

/* Sizes a side with own share s keeps of a node split by `choice` (cost._one_side). */
static Dims one_side(const Dims *x, int choice, double s) {
    Dims o = *x;
    double b = 1.0, i = 1.0, f = 1.0;
    if (s <= 0.0) b = i = f = 0.0;
    else if (choice == C_BATCH || choice == C_ROWS) b = s;
    else if (choice == C_IN) i = s;
    else if (choice == C_OUT) f = s;
    else if (choice == C_COLS) i = f = s;
    else return o;
    o.batch = x->batch * b; o.replica = x->replica * b; o.in_f = x->in_f * i; o.out_f = x->out_f * f;
    return o;
}

static Dims side_dims(const Dims *x, int choice, double a, int side, int has) {
    if (!has) return one_side(x, choice, 0.0);
    return one_side(x, choice, side == 0 ? a : 1.0 - a);
}

/* Elements each side receives inside a node split by `choice` with work on both sides (section 2). */
static double intra_elements(const Dims *x, int choice) {
    double size = 0.0;
    if (choice == C_BATCH || choice == C_ROWS) size = d_weight(x);
    else if (choice == C_IN) size = d_out(x);
    else if (choice == C_OUT) size = d_in(x);
    if (GIVE[choice] == 1) size = size + d_rowx(x);
    return size;
}

/* Parse (dims tuple, out-ops tuple, in-ops tuple) into x; ops as flat float tuples of 5. */
static int parse_dims(PyObject *dt, PyObject *out_ops, PyObject *in_ops, Dims *x, OpStore *store) {
    if (!PyTuple_Check(dt) || PyTuple_GET_SIZE(dt) != DIMS_FIELDS || !PyTuple_Check(out_ops) || !PyTuple_Check(in_ops) ||
        PyTuple_GET_SIZE(out_ops) % 5 || PyTuple_GET_SIZE(in_ops) % 5 || PyTuple_GET_SIZE(out_ops) / 5 > MAXOPS ||
        PyTuple_GET_SIZE(in_ops) / 5 > MAXOPS) {
        PyErr_SetString(PyExc_ValueError, "dims: expected 14 figures and ops as 5 figures each");
        return -1;
    }
    double v[DIMS_FIELDS];
    for (int i = 0; i < DIMS_FIELDS; ++i) v[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(dt, i));
    x->batch = v[0]; x->in_f = v[1]; x->out_f = v[2]; x->in_sp = v[3]; x->out_sp = v[4]; x->kernel = v[5];
    x->groups = v[6]; x->tables = v[7]; x->experts = v[8]; x->active = v[9]; x->replica = v[10];
    x->recompute = v[11] != 0.0; x->micro = (long)v[12]; x->ckpt = v[13];
    PyObject *lists[2] = {out_ops, in_ops};
    for (int l = 0; l < 2; ++l) {
        int n = (int)(PyTuple_GET_SIZE(lists[l]) / 5);
        Op *ops = l ? store->in : store->out;
        for (int i = 0; i < n; ++i) {
            ops[i].flops = PyFloat_AsDouble(PyTuple_GET_ITEM(lists[l], 5 * i));
            ops[i].traffic = PyFloat_AsDouble(PyTuple_GET_ITEM(lists[l], 5 * i + 1));
            ops[i].stored = PyFloat_AsDouble(PyTuple_GET_ITEM(lists[l], 5 * i + 2));
            ops[i].row_exchange = PyFloat_AsDouble(PyTuple_GET_ITEM(lists[l], 5 * i + 3));
            ops[i].kind = (int)PyFloat_AsDouble(PyTuple_GET_ITEM(lists[l], 5 * i + 4));
        }
        if (l) x->n_in = n; else x->n_out = n;
    }
    x->out_ops = store->out;
    x->in_ops = store->in;
    if (x->micro < 1) {
        PyErr_SetString(PyExc_ValueError, "dims: micro-batches must be >= 1");
        return -1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

static int parse_dev(PyObject *t, Dev *d) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7) {
        PyErr_SetString(PyExc_ValueError, "device: expected 7 figures");
        return -1;
    }
    double v[7];
    for (int i = 0; i < 7; ++i) v[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(t, i));
    *d = (Dev){v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(compute_doc,
"compute(dims, out_ops, in_ops, device, bytes_per_element) -> float\n\n"
"Seconds of one training step of a layer's part on a device (docs/costmodel.md section 5).\n"
"dims: (batch, Di, Do, in spatial, out spatial, kernel, groups, tables, experts, active,\n"
"replica, recompute, micro-batches); ops: 5 figures each (flops, traffic, stored, row\n"
"exchange, kind: 0 gemm, 2 attention); device: (peak FLOP/s, HBM B/s, efficiency, conv and\n"
"attention efficiency (NaN: the efficiency), HBM efficiency, kernel overhead s).");

static PyObject *compute(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io, *dv;
    double bpe;
    Dims x;
    OpStore ops;
    Dev d;
    if (!PyArg_ParseTuple(args, "OOOOd", &dt, &oo, &io, &dv, &bpe)) return NULL;
    if (parse_dims(dt, oo, io, &x, &ops) < 0 || parse_dev(dv, &d) < 0) return NULL;
    return PyFloat_FromDouble(compute_seconds(&x, &d, bpe));
}

PyDoc_STRVAR(activations_doc,
"activations(dims, out_ops, in_ops) -> float\n\n"
"Activation elements of one micro-batch that backward needs, all of them (no recomputation;\n"
"docs/costmodel.md sections 1 and 6.3): what a block holds while it is recomputed.");

static PyObject *activations(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io;
    Dims x;
    OpStore ops;
    if (!PyArg_ParseTuple(args, "OOO", &dt, &oo, &io)) return NULL;
    if (parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    return PyFloat_FromDouble(d_stored_all(&x));
}

PyDoc_STRVAR(memory_doc,
"memory(dims, out_ops, in_ops, bytes_per_element, optimizer_bytes, zero) -> float\n\n"
"Bytes a holder of a layer's part keeps (docs/costmodel.md section 6); arguments as compute's.");

static PyObject *memory(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io;
    double bpe, opt;
    long zero;
    Dims x;
    OpStore ops;
    if (!PyArg_ParseTuple(args, "OOOddl", &dt, &oo, &io, &bpe, &opt, &zero)) return NULL;
    if (parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    return PyFloat_FromDouble(memory_bytes(&x, bpe, opt, zero));
}

PyDoc_STRVAR(gathered_doc,
"gathered(dims, out_ops, in_ops, bytes_per_element, zero) -> float\n\n"
"Bytes ZeRO stage 3 gathers for a layer's part while its unit runs: its weights less the shard\n"
"it keeps (docs/costmodel.md section 6.1); 0 below stage 3.");

static PyObject *gathered(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io;
    double bpe;
    long zero;
    Dims x;
    OpStore ops;
    if (!PyArg_ParseTuple(args, "OOOdl", &dt, &oo, &io, &bpe, &zero)) return NULL;
    if (parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    return PyFloat_FromDouble(gathered_bytes(&x, bpe, zero));
}

PyDoc_STRVAR(roof_doc,
"roofline(flops, traffic_bytes, device, kind, kernels) -> float\n\n"
"max(FLOPs / (e_kind peak), bytes / (m HBM), kernels t0) (section 5); kind 0 gemm, 1 conv,\n"
"2 attention; device as compute's.");

static PyObject *roof(PyObject *self, PyObject *args) {
    double flops, traffic;
    PyObject *dv;
    int kind;
    long kernels;
    Dev d;
    if (!PyArg_ParseTuple(args, "ddOil", &flops, &traffic, &dv, &kind, &kernels)) return NULL;
    if (parse_dev(dv, &d) < 0) return NULL;
    return PyFloat_FromDouble(roofline(flops, traffic, &d, kind, kernels));
}

PyDoc_STRVAR(intra_doc,
"intra(dims, out_ops, in_ops, choice) -> float\n\n"
"Elements each side receives inside a node split by `choice` (cost.CHOICE_CODE) with work on\n"
"both sides (docs/costmodel.md section 2).");

static PyObject *intra(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io;
    int choice;
    Dims x;
    if (!PyArg_ParseTuple(args, "OOOi", &dt, &oo, &io, &choice)) return NULL;
    if (choice < 0 || choice > 5) {
        PyErr_SetString(PyExc_ValueError, "intra: choice code out of range");
        return NULL;
    }
    OpStore ops;
    if (parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    return PyFloat_FromDouble(intra_elements(&x, choice));
}

/* Per state, the fields states() writes (then K steps per side). */
enum { S_COMP0, S_COMP1, S_MEM0, S_MEM1, S_INTRA0, S_INTRA1, S_WINTRA0, S_WINTRA1, S_SIZE, S_EXTRA, S_WEIGHTED, S_ACT0, S_ACT1, S_GATH0, S_GATH1, NS };

PyDoc_STRVAR(states_doc,
"states(dims, out_ops, in_ops, choices, lo, hi, has0, has1, devices, params, out)\n\n"
"A node's state table (cost.StateTable.build; docs/costmodel.md sections 2, 5, 6, 6.3, 6.4):\n"
"per state (choice code, share interval [lo, hi], work flags) each side's compute at the\n"
"interval's ends and at K points, memory, intra-layer elements and their per-step part.\n"
"params: (bytes per element, optimizer bytes, ZeRO stage, micro-batches, collective?, IN\n"
"reduction elements (NaN: none), rows cut above?, columns cut above?, K). out: float64,\n"
"(NS + 2K) per state.");

static PyObject *states(PyObject *self, PyObject *args) {
    PyObject *dt, *oo, *io, *devs, *params;
    Py_buffer ch, lo, hi, h0, h1, out;
    if (!PyArg_ParseTuple(args, "OOOy*y*y*y*y*O!O!w*", &dt, &oo, &io, &ch, &lo, &hi, &h0, &h1, &PyTuple_Type, &devs,
                          &PyTuple_Type, &params, &out))
        return NULL;
    PyObject *result = NULL;
    Dims x;
    OpStore *ops = PyMem_Malloc(sizeof(OpStore));
    Dev dev[2];
    Py_ssize_t S = lo.len / 8;
    if (!ops) { PyErr_NoMemory(); goto done; }
    if (parse_dims(dt, oo, io, &x, ops) < 0) goto done;
    if (PyTuple_GET_SIZE(devs) != 2 || parse_dev(PyTuple_GET_ITEM(devs, 0), &dev[0]) < 0 ||
        parse_dev(PyTuple_GET_ITEM(devs, 1), &dev[1]) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "states: two devices expected");
        goto done;
    }
    if (PyTuple_GET_SIZE(params) != 9) {
        PyErr_SetString(PyExc_ValueError, "states: 9 params expected");
        goto done;
    }
    double p[9];
    for (int i = 0; i < 9; ++i) p[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(params, i));
    if (PyErr_Occurred()) goto done;
    double bpe = p[0], opt = p[1], inred = p[5];
    long zero = (long)p[2], m = (long)p[3], K = (long)p[8];
    int collective = p[4] != 0.0, above0 = p[6] != 0.0, above1 = p[7] != 0.0;
    Py_ssize_t width = NS + 2 * K;
    if (K < 1 || ch.len != S * 8 || hi.len != S * 8 || h0.len != S * 8 || h1.len != S * 8 || out.len < S * width * 8) {
        PyErr_SetString(PyExc_ValueError, "states: arrays of inconsistent sizes");
        goto done;
    }
    const double *cv = ch.buf, *lv = lo.buf, *hv = hi.buf, *a0 = h0.buf, *a1 = h1.buf;
    double *o = out.buf;
    double rowx = d_rowx(&x), tab = x.tables * x.in_f;
    for (Py_ssize_t s = 0; s < S; ++s) {
        int c = (int)cv[s], has0 = a0[s] != 0.0, has1 = a1[s] != 0.0, split = has0 && has1;
        double l = lv[s], h = hv[s], *r = o + s * width;
        if (c < 0 || c > 5) {
            PyErr_SetString(PyExc_ValueError, "states: choice code out of range");
            goto done;
        }
        double size = split ? intra_elements(&x, c) : 0.0;
        if (c == C_IN && split && inred == inred) size = inred; /* (IN gives its output whole) */
        /* both sides keep the same part of a table (OUT, WHOLE) or of the row statistics (IN,
         * WHOLE) that a split above reduced: the total reaches side 1, which forwards it; at
         * ZeRO-3 side 1 keeps the table's shard and side 2 gathers it before every forward and
         * backward (section 6.1) */
        double extra = 0.0, tabx = (zero >= 3 ? 2.0 * (double)m : 1.0) * tab;
        if (split && above0 && (c == C_OUT || c == C_WHOLE)) extra += tabx;
        if (split && above1 && (c == C_IN || c == C_WHOLE)) extra += rowx;
        /* the gradient exchange of replicated weights is per step; the rest per micro-batch (6.4) */
        int weighted = c == C_BATCH || (c == C_ROWS && size > 0);
        double w0 = 0.0, w1 = 0.0;
        if (weighted && split) {
            if (zero <= 1) { w0 = size; w1 = size; }
            else if (zero == 2) { w0 = size * (1.0 + (double)(m - 1) * l); w1 = size * (1.0 + (double)(m - 1) * (1.0 - h)); }
            else { w0 = size * (double)m * (2.0 - h); w1 = size * (double)m * (1.0 + l); }
        }
        double s0 = weighted ? 0.0 : size, s1 = s0;
        if (x.recompute && split && !weighted) { /* the forward again, with its exchanges (6.3) */
            double again = (c == C_IN ? size : 0.0) + 0.5 * (GIVE[c] == 1 ? rowx : 0.0);
            double forwarded = (above1 && (c == C_IN || c == C_WHOLE)) ? 0.5 * rowx : 0.0;
            s0 = size + again;
            s1 = size + again + forwarded;
        }
        if (collective && weighted) { w0 = 0.0; w1 = 0.0; } /* the all-reduce is priced apart */
        double wextra = (split && above0 && (c == C_OUT || c == C_WHOLE)) ? tabx : 0.0;
        Dims low0 = side_dims(&x, c, l, 0, has0), low1 = side_dims(&x, c, h, 1, has1);
        double *st0 = r + NS, *st1 = r + NS + K;
        if (K == 1) {
            st0[0] = compute_seconds(&low0, &dev[0], bpe);
            st1[0] = compute_seconds(&low1, &dev[1], bpe);
        } else { /* numpy.linspace(lo, hi, K) */
            double delta = h - l, step = delta / (double)(K - 1);
            for (long q = 0; q < K; ++q) {
                double g = step == 0 ? (double)q / (double)(K - 1) * delta + l : (double)q * step + l;
                if (q == K - 1) g = h;
                Dims a = side_dims(&x, c, g, 0, has0), b = side_dims(&x, c, g, 1, has1);
                st0[q] = compute_seconds(&a, &dev[0], bpe);
                st1[q] = compute_seconds(&b, &dev[1], bpe);
            }
        }
        r[S_COMP0] = st0[0];
        r[S_COMP1] = st1[K - 1];
        r[S_MEM0] = memory_bytes(&low0, bpe, opt, zero);
        r[S_MEM1] = memory_bytes(&low1, bpe, opt, zero);
        r[S_INTRA0] = w0 + s0;
        r[S_INTRA1] = w1 + s1 + extra;
        r[S_WINTRA0] = w0;
        r[S_WINTRA1] = w1 + wextra;
        r[S_SIZE] = size;
        r[S_EXTRA] = 0.0;
        r[S_WEIGHTED] = weighted;
        r[S_ACT0] = d_stored_all(&low0) * bpe;
        r[S_ACT1] = d_stored_all(&low1) * bpe;
        r[S_GATH0] = gathered_bytes(&low0, bpe, zero);
        r[S_GATH1] = gathered_bytes(&low1, bpe, zero);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(ops);
    PyBuffer_Release(&ch);
    PyBuffer_Release(&lo);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&h0);
    PyBuffer_Release(&h1);
    PyBuffer_Release(&out);
    return result;
}

/* ---- the per-node lower bound over the array's tree (docs/costmodel.md section 8) --------- */

/* One group of the array: a leaf's device, or two halves, whether they are interchangeable, and
 * the split's side figures (as relayout's) with whether BATCH / ROWS reductions count 0 (a
 * collective array's enclosing all-reduce, or overlap). `sig`: equal for interchangeable groups. */
typedef struct {
    int leaf, left, right, same, sig, free_batch;
    Dev dev;
    Side sd;
} Group;

typedef struct {
    int n;
    Group *g;
    /* bounds asked for (memo hits included) over every call on this tree, and the most allowed:
     * an unbalanced tree dozens of levels deep makes the recursion exponential in its depth */
    long long calls, budget;
} Tree;

static void tree_free(PyObject *cap) {
    Tree *t = PyCapsule_GetPointer(cap, "parplan.tree");
    if (t) { PyMem_Free(t->g); PyMem_Free(t); }
}

PyDoc_STRVAR(tree_doc,
"tree(groups, budget) -> capsule\n\n"
"The array for bound_lb: per group (leaf, left, right, same, sig, free_batch, device figures\n"
"(7, a leaf's), side figures (8, as relayout's; an inner group's)), children by index; budget:\n"
"the most bounds bound_lb / bound_states may ask for on it, memo hits included, over all calls\n"
"(then they raise OverflowError).");

static PyObject *tree(PyObject *self, PyObject *args) {
    PyObject *groups;
    long long budget;
    if (!PyArg_ParseTuple(args, "O!L", &PyTuple_Type, &groups, &budget)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(groups);
    Tree *t = PyMem_Calloc(1, sizeof(Tree));
    if (!t || !(t->g = PyMem_Calloc(n ? n : 1, sizeof(Group)))) { PyMem_Free(t); return PyErr_NoMemory(); }
    t->n = (int)n;
    t->budget = budget;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *e = PyTuple_GET_ITEM(groups, i);
        Group *g = &t->g[i];
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 8) goto bad;
        long v[6];
        for (int x = 0; x < 6; ++x) v[x] = PyLong_AsLong(PyTuple_GET_ITEM(e, x));
        g->leaf = (int)v[0]; g->left = (int)v[1]; g->right = (int)v[2]; g->same = (int)v[3]; g->sig = (int)v[4];
        g->free_batch = (int)v[5];
        if (PyErr_Occurred()) goto fail;
        if (parse_dev(PyTuple_GET_ITEM(e, 6), &g->dev) < 0) goto fail;
        PyObject *s = PyTuple_GET_ITEM(e, 7);
        if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 8) goto bad;
        double w[8];
        for (int x = 0; x < 8; ++x) w[x] = PyFloat_AsDouble(PyTuple_GET_ITEM(s, x));
        if (PyErr_Occurred()) goto fail;
        g->sd = (Side){w[0], {w[1], w[2]}, w[3], (long)w[4], (long)w[5], w[6] != 0.0, w[7] != 0.0, {w[0] / w[1], w[0] / w[2]}};
        if (!g->leaf && (g->left < 0 || g->left >= n || g->right < 0 || g->right >= n || g->left <= i || g->right <= i))
            goto bad;
    }
    return PyCapsule_New(t, "parplan.tree", tree_free);
bad:
    PyErr_SetString(PyExc_ValueError, "tree: malformed groups (children must come after their parent)");
fail:
    PyMem_Free(t->g);
    PyMem_Free(t);
    return NULL;
}

/* The memo of one node kind: (group signature, B, Di, Do) -> bound, open addressing. */
typedef struct {
    int sig;
    double b, i, o, v;
    int used;
} Entry;

typedef struct {
    Py_ssize_t cap, size;
    Entry *e;
} Memo;

static void memo_free(PyObject *cap) {
    Memo *m = PyCapsule_GetPointer(cap, "parplan.memo");
    if (m) { PyMem_Free(m->e); PyMem_Free(m); }
}

static PyObject *memo(PyObject *self, PyObject *noargs) {
    Memo *m = PyMem_Calloc(1, sizeof(Memo));
    if (!m || !(m->e = PyMem_Calloc(1024, sizeof(Entry)))) { PyMem_Free(m); return PyErr_NoMemory(); }
    m->cap = 1024;
    return PyCapsule_New(m, "parplan.memo", memo_free);
}

static inline unsigned long long bits(double x) {
    unsigned long long u;
    if (x == 0.0) x = 0.0; /* -0.0 and 0.0 are one key, as in a Python dict */
    memcpy(&u, &x, 8);
    return u;
}

/* splitmix64's finaliser */
static inline unsigned long long mix64(unsigned long long x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline Py_ssize_t slot(const Memo *m, int sig, double b, double i, double o) {
    /* every input bit moves the low bits the table reads (shares like k/1024 leave a double's low
     * mantissa bits zero: a weak mix clusters them into long probe runs) */
    unsigned long long h = mix64((unsigned long long)sig + 0x9E3779B97F4A7C15ULL);
    h = mix64(h ^ bits(b));
    h = mix64(h ^ bits(i));
    h = mix64(h ^ bits(o));
    Py_ssize_t s = (Py_ssize_t)(h & (unsigned long long)(m->cap - 1));
    while (m->e[s].used && !(m->e[s].sig == sig && m->e[s].b == b && m->e[s].i == i && m->e[s].o == o))
        s = (s + 1) & (m->cap - 1);
    return s;
}

static int memo_put(Memo *m, int sig, double b, double i, double o, double v) {
    if (2 * (m->size + 1) > m->cap) { /* grow */
        Entry *old = m->e;
        Py_ssize_t oc = m->cap;
        m->e = PyMem_Calloc(2 * oc, sizeof(Entry));
        if (!m->e) { m->e = old; PyErr_NoMemory(); return -1; }
        m->cap = 2 * oc;
        for (Py_ssize_t x = 0; x < oc; ++x)
            if (old[x].used) m->e[slot(m, old[x].sig, old[x].b, old[x].i, old[x].o)] = old[x];
        PyMem_Free(old);
    }
    Py_ssize_t s = slot(m, sig, b, i, o);
    if (!m->e[s].used) ++m->size;
    m->e[s] = (Entry){sig, b, i, o, v, 1};
    return 0;
}

typedef struct {
    Tree *t;
    Memo *m;
    const int *choices;
    int nc, grid;
    double bpe;
    int error;
} Bound;

static double lb(Bound *B, int gi, const Dims *d);

/* Each side's seconds for the node's own reduction at group g when both sides have work. With
 * micro-batches the reduction is counted as a per-step exchange (one latency per step, or per
 * micro-batch at ZeRO >= 2), the fewest messages the evaluator can charge it (receive_seconds):
 * a weight-gradient exchange is sent once per step, the rest once per micro-batch. */
static void bound_comm(const Group *g, const Dims *d, int c, double *c1, double *c2) {
    double size = intra_elements(d, c);
    if (g->free_batch && (c == C_BATCH || c == C_ROWS)) size = 0.0;
    *c1 = receive_seconds(&g->sd, 0, size, size);
    *c2 = g->sd.bw[0] == g->sd.bw[1] ? *c1 : receive_seconds(&g->sd, 1, size, size);
}

static inline double bis_a(Bound *B, const Group *g, const Dims *d, int c, double c1, long k) {
    Dims x = one_side(d, c, (double)k / (double)B->grid);
    return lb(B, g->left, &x) + c1;
}

static inline double bis_b(Bound *B, const Group *g, const Dims *d, int c, double c2, long k) {
    Dims x = one_side(d, c, 1.0 - (double)(k + 1) / (double)B->grid);
    return lb(B, g->right, &x) + c2;
}

/* min over k of max(a(k), b(k)), a nondecreasing and b nonincreasing: the first k with a >= b. */
static double bisect(Bound *B, const Group *g, const Dims *d, int c, double c1, double c2) {
    long lo = 0, hi = B->grid - 1;
    double ah = bis_a(B, g, d, c, c1, hi), bh = bis_b(B, g, d, c, c2, hi);
    if (ah < bh) return bh;
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        double am = bis_a(B, g, d, c, c1, mid), bm = bis_b(B, g, d, c, c2, mid);
        if (am >= bm) hi = mid;
        else lo = mid + 1;
    }
    if (lo > 0) {
        double x = bis_a(B, g, d, c, c1, lo), y = bis_b(B, g, d, c, c2, lo - 1);
        return pmin(x, y);
    }
    return bis_a(B, g, d, c, c1, lo);
}

/* LB_g(d): a lower bound on the node's time at group g over every plan below it. */
static double lb(Bound *B, int gi, const Dims *d) {
    const Group *g = &B->t->g[gi];
    if (B->error) return 0.0; /* unwinding */
    if (++B->t->calls > B->t->budget) {
        B->error = 2;
        return 0.0;
    }
    Py_ssize_t s = slot(B->m, g->sig, d->batch, d->in_f, d->out_f);
    if (B->m->e[s].used) return B->m->e[s].v;
    double best;
    if (g->leaf) {
        best = compute_seconds(d, &g->dev, B->bpe);
    } else {
        best = lb(B, g->left, d);
        if (!g->same) best = pmin(best, lb(B, g->right, d));
        for (int x = 0; x < B->nc; ++x) {
            int c = B->choices[x];
            double c1, c2;
            bound_comm(g, d, c, &c1, &c2);
            if (g->same) {
                Dims h = one_side(d, c, 0.5);
                best = pmin(best, lb(B, g->left, &h) + pmax(c1, c2));
            } else {
                best = pmin(best, bisect(B, g, d, c, c1, c2));
            }
        }
    }
    if (B->error) return 0.0; /* a part of it was cut short: nothing to remember */
    if (memo_put(B->m, g->sig, d->batch, d->in_f, d->out_f, best) < 0) B->error = 1;
    return best;
}

static int bound_setup(Bound *B, PyObject *tcap, PyObject *mcap, PyObject *choices, int grid, double bpe, int *codes) {
    B->t = PyCapsule_GetPointer(tcap, "parplan.tree");
    B->m = PyCapsule_GetPointer(mcap, "parplan.memo");
    if (!B->t || !B->m) return -1;
    Py_ssize_t nc = PyTuple_GET_SIZE(choices);
    if (nc < 1 || nc > 6 || grid < 1) {
        PyErr_SetString(PyExc_ValueError, "bound: 1-6 choices and a grid >= 1");
        return -1;
    }
    for (Py_ssize_t x = 0; x < nc; ++x) {
        codes[x] = (int)PyLong_AsLong(PyTuple_GET_ITEM(choices, x));
        if (codes[x] < 0 || codes[x] > 5) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bound: choice code out of range");
            return -1;
        }
    }
    *B = (Bound){B->t, B->m, codes, (int)nc, grid, bpe, 0};
    return 0;
}

PyDoc_STRVAR(bound_lb_doc,
"bound_lb(tree, memo, group, dims, out_ops, in_ops, choices, grid, bytes_per_element) -> float\n\n"
"A lower bound on a node's time at `group` over every plan below it (docs/costmodel.md\n"
"section 8; solvers/bound.py's LB_g): a leaf's compute, else the best of staying on one half\n"
"and of each choice split at the share (interchangeable halves: 1/2; else bisected on a grid\n"
"of `grid` intervals) with its own reduction. `memo` holds one node kind's bounds.");

static PyObject *bound_lb(PyObject *self, PyObject *args) {
    PyObject *tcap, *mcap, *dt, *oo, *io, *choices;
    int group, grid, codes[6];
    double bpe;
    Dims x;
    OpStore ops;
    Bound B;
    if (!PyArg_ParseTuple(args, "OOiOOOO!id", &tcap, &mcap, &group, &dt, &oo, &io, &PyTuple_Type, &choices, &grid,
                          &bpe))
        return NULL;
    if (bound_setup(&B, tcap, mcap, choices, grid, bpe, codes) < 0 || parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    if (group < 0 || group >= B.t->n) {
        PyErr_SetString(PyExc_IndexError, "bound_lb: no such group");
        return NULL;
    }
    double v = lb(&B, group, &x);
    if (B.error == 2) PyErr_SetString(PyExc_OverflowError, "bound: over the tree's budget of bounds");
    if (B.error) return NULL;
    return PyFloat_FromDouble(v);
}

PyDoc_STRVAR(bound_comm_doc,
"bound_comm(tree, group, dims, out_ops, in_ops, choice) -> (seconds side 1, seconds side 2)\n\n"
"Each side's seconds for a node's own reduction at `group` when both sides have work, as the\n"
"bound recursion charges it (0 for BATCH / ROWS on collective arrays or with overlap).");

static PyObject *bound_comm_py(PyObject *self, PyObject *args) {
    PyObject *tcap, *dt, *oo, *io;
    int group, choice;
    Dims x;
    OpStore ops;
    if (!PyArg_ParseTuple(args, "OiOOOi", &tcap, &group, &dt, &oo, &io, &choice)) return NULL;
    const Tree *t = PyCapsule_GetPointer(tcap, "parplan.tree");
    if (!t) return NULL;
    if (group < 0 || group >= t->n || t->g[group].leaf || choice < 0 || choice > 5) {
        PyErr_SetString(PyExc_ValueError, "bound_comm: an inner group and a choice code expected");
        return NULL;
    }
    if (parse_dims(dt, oo, io, &x, &ops) < 0) return NULL;
    double c1, c2;
    bound_comm(&t->g[group], &x, choice, &c1, &c2);
    return Py_BuildValue("(dd)", c1, c2);
}

PyDoc_STRVAR(bound_states_doc,
"bound_states(tree, memo, left, right, dims, out_ops, in_ops, choices, grid, bpe, state_choices,\n"
"             lo, hi, has0, has1, out)\n\n"
"For every state of a node's table (choice code, share interval, work flags), bound_lb of the\n"
"part each half keeps (side 1 at the interval's lower end, side 2 at its upper end), written\n"
"to out (float64, 2 x states).");

static PyObject *bound_states(PyObject *self, PyObject *args) {
    PyObject *tcap, *mcap, *dt, *oo, *io, *choices;
    int left, right, grid, codes[6];
    double bpe;
    Py_buffer ch, lo, hi, h0, h1, out;
    if (!PyArg_ParseTuple(args, "OOiiOOOO!idy*y*y*y*y*w*", &tcap, &mcap, &left, &right, &dt, &oo, &io, &PyTuple_Type,
                          &choices, &grid, &bpe, &ch, &lo, &hi, &h0, &h1, &out))
        return NULL;
    PyObject *result = NULL;
    Dims x;
    OpStore *ops = PyMem_Malloc(sizeof(OpStore));
    Bound B;
    Py_ssize_t S = ch.len / 8;
    if (!ops) { PyErr_NoMemory(); goto done; }
    if (bound_setup(&B, tcap, mcap, choices, grid, bpe, codes) < 0 || parse_dims(dt, oo, io, &x, ops) < 0) goto done;
    if (left < 0 || left >= B.t->n || right < 0 || right >= B.t->n || lo.len != S * 8 || hi.len != S * 8 ||
        h0.len != S * 8 || h1.len != S * 8 || out.len < 2 * S * 8) {
        PyErr_SetString(PyExc_ValueError, "bound_states: inconsistent arguments");
        goto done;
    }
    const double *cv = ch.buf, *lv = lo.buf, *hv = hi.buf, *a0 = h0.buf, *a1 = h1.buf;
    double *o = out.buf;
    for (Py_ssize_t s = 0; s < S; ++s) {
        int c = (int)cv[s];
        if (c < 0 || c > 5) {
            PyErr_SetString(PyExc_ValueError, "bound_states: choice code out of range");
            goto done;
        }
        Dims d0 = side_dims(&x, c, lv[s], 0, a0[s] != 0.0), d1 = side_dims(&x, c, hv[s], 1, a1[s] != 0.0);
        o[s] = lb(&B, left, &d0);
        o[S + s] = lb(&B, right, &d1);
        if (B.error == 2) PyErr_SetString(PyExc_OverflowError, "bound: over the tree's budget of bounds");
        if (B.error) goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(ops);
    PyBuffer_Release(&ch);
    PyBuffer_Release(&lo);
    PyBuffer_Release(&hi);
    PyBuffer_Release(&h0);
    PyBuffer_Release(&h1);
    PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(overlap_doc,
"overlap(work, comm, weight, out) or overlap(work, comm, weight) -> float\n\n"
"A side's time for a node (docs/costmodel.md section 4.2): work + comm - min(weight,\n"
"OVERLAP_WINDOW work), element by element over float64 buffers of one size, or for three\n"
"numbers.");

static PyObject *overlap(PyObject *self, PyObject *args) {
    if (PyTuple_GET_SIZE(args) == 3) {
        double w, c, g;
        if (!PyArg_ParseTuple(args, "ddd", &w, &c, &g)) return NULL;
        return PyFloat_FromDouble(overlap_time(w, c, g));
    }
    Py_buffer wv, cv, gv, ov;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &wv, &cv, &gv, &ov)) return NULL;
    PyObject *result = NULL;
    if (wv.len != cv.len || wv.len != gv.len || wv.len != ov.len || wv.len % 8) {
        PyErr_SetString(PyExc_ValueError, "overlap: float64 arrays of one size expected");
    } else {
        const double *w = wv.buf, *c = cv.buf, *g = gv.buf;
        double *o = ov.buf;
        for (Py_ssize_t x = 0; x < wv.len / 8; ++x) o[x] = overlap_time(w[x], c[x], g[x]);
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&wv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&gv);
    PyBuffer_Release(&ov);
    return result;
}

PyDoc_STRVAR(floored_doc,
"floored(times, floor, out)\n\n"
"A node's times at a split whose sibling sets `floor` > 0 (cost.floored_time): max(t, floor)\n"
"plus FLOOR_TIE_WEIGHT t, element by element (float64 buffers of one size).");

static PyObject *floored(PyObject *self, PyObject *args) {
    Py_buffer tv, ov;
    double floor;
    if (!PyArg_ParseTuple(args, "y*dw*", &tv, &floor, &ov)) return NULL;
    PyObject *result = NULL;
    if (tv.len != ov.len || tv.len % 8) {
        PyErr_SetString(PyExc_ValueError, "floored: times and out must be float64 arrays of one size");
        goto done;
    }
    const double *t = tv.buf;
    double *o = ov.buf;
    for (Py_ssize_t x = 0; x < tv.len / 8; ++x) o[x] = floor_value(t[x], floor);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&tv);
    PyBuffer_Release(&ov);
    return result;
}

PyDoc_STRVAR(edge_doc,
"edge(give, need, s_producer, s_consumer) -> float\n\n"
"Fraction of one tensor a side receives on one edge at the root, forward plus backward, the\n"
"producer giving layout `give` at own share s_producer, the consumer needing `need` at\n"
"s_consumer (layout codes 0 rows, 1 columns, 2 whole; docs/costmodel.md section 3).");

static PyObject *edge(PyObject *self, PyObject *args) {
    int give, need;
    double sp, sc;
    if (!PyArg_ParseTuple(args, "iidd", &give, &need, &sp, &sc)) return NULL;
    double nx, ny, hx, hy, cx, cy;
    need_extent(need, sc, sc > 0.0, &nx, &ny);
    hold_extent(give, sp, sp > 0.0, &hx, &hy);
    double f = forward_extent(nx, ny, hx, hy);
    hold_extent(need, sc, sc > 0.0, &cx, &cy);
    return PyFloat_FromDouble(f + backward_extent(hx, hy, cx, cy));
}

PyDoc_STRVAR(receive_doc,
"receive(side, i, elements, weight_elements) -> float\n\n"
"Seconds side i (0 or 1) spends receiving `elements`, `weight_elements` of them a per-step\n"
"weight exchange (docs/costmodel.md sections 4 and 6.4); `side` as relayout's.");

static PyObject *receive(PyObject *self, PyObject *args) {
    PyObject *side_t;
    int i;
    double el, wel, v[8];
    if (!PyArg_ParseTuple(args, "O!idd", &PyTuple_Type, &side_t, &i, &el, &wel)) return NULL;
    if (PyTuple_GET_SIZE(side_t) != 8 || i < 0 || i > 1) {
        PyErr_SetString(PyExc_ValueError, "receive: side must have 8 figures and i be 0 or 1");
        return NULL;
    }
    for (int x = 0; x < 8; ++x) v[x] = PyFloat_AsDouble(PyTuple_GET_ITEM(side_t, x));
    if (PyErr_Occurred()) return NULL;
    Side sd = {v[0], {v[1], v[2]}, v[3], (long)v[4], (long)v[5], v[6] != 0.0, v[7] != 0.0, {v[0] / v[1], v[0] / v[2]}};
    return PyFloat_FromDouble(receive_seconds(&sd, i, el, wel));
}

static PyMethodDef methods[] = {
    {"relayout", relayout, METH_VARARGS, relayout_doc},
    {"values", values, METH_VARARGS, values_doc},
    {"eliminate", eliminate, METH_VARARGS, eliminate_doc},
    {"solve", solve, METH_VARARGS, solve_doc},
    {"floored", floored, METH_VARARGS, floored_doc},
    {"overlap", overlap, METH_VARARGS, overlap_doc},
    {"states", states, METH_VARARGS, states_doc},
    {"compute", compute, METH_VARARGS, compute_doc},
    {"memory", memory, METH_VARARGS, memory_doc},
    {"activations", activations, METH_VARARGS, activations_doc},
    {"gathered", gathered, METH_VARARGS, gathered_doc},
    {"roofline", roof, METH_VARARGS, roof_doc},
    {"intra", intra, METH_VARARGS, intra_doc},
    {"tree", tree, METH_VARARGS, tree_doc},
    {"memo", memo, METH_NOARGS, "memo() -> capsule: an empty memo of one node kind's bounds."},
    {"bound_lb", bound_lb, METH_VARARGS, bound_lb_doc},
    {"bound_states", bound_states, METH_VARARGS, bound_states_doc},
    {"bound_comm", bound_comm_py, METH_VARARGS, bound_comm_doc},
    {"receive", receive, METH_VARARGS, receive_doc},
    {"edge", edge, METH_VARARGS, edge_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pricing",
                                    "parplan's compiled pricing core (docs/architecture.md).", -1, methods};

PyMODINIT_FUNC PyInit__pricing(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "NF", NF) < 0 || PyModule_AddIntConstant(m, "NS", NS) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
