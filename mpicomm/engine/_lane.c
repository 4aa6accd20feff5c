/* The compiled executor's lane: a program's data steps run in C with the GIL released.
 *
 * A lane is a compiled plan's steps as plain records (mpicomm/engine/lane.py builds it
 * from a Program): per step, the prepared persistent requests to start (their MPI
 * handles), the records to run when the step is posted (copies into a message's
 * staging buffer), the agreement words to check once its messages arrived, and the
 * local ops to run after that (copies, and reductions with MPI's built-in ops on the
 * common element types). Nothing here calls Python: the loop starts, tests and waits
 * for requests and runs the records with the GIL released, and hands control back to
 * the Python executor (mpicomm/engine/executor.py) for anything else - a request
 * that is not complete yet (nonblocking advance), a message longer than its receive,
 * an MPI error, or agreement words that differ from this rank's (the disagreement
 * path stays Python's).
 *
 * MPI is called through function pointers looked up in the MPI library mpi4py
 * loaded (bind()), with handles of the size that library uses, so one build serves
 * MPICH, Open MPI and the MPI-5 standard ABI alike and needs no mpi.h.
 *
 * advance(k, spins, block) returns
 *   r >= 0   step r's requests are in flight (nonblocking, or block with spins only)
 *   -1       the program finished
 *   r <= -2  an event: e = (-r - 2) & 3, at step k = (-r - 2) >> 2;
 *            e = 1 bail (the words differ: Python runs the rest), 2 truncated
 *            (a message longer than posted: Python marks the run broken), 3 MPI
 *            error (its code in last_rc).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int (*startall_t)(int, void *);
typedef int (*testall_t)(int, void *, int *, void *);
typedef int (*waitall_t)(int, void *, void *);
typedef int (*errclass_t)(int, int *);

static startall_t mpi_startall;
static testall_t mpi_testall;
static waitall_t mpi_waitall;
static errclass_t mpi_error_class;
static Py_ssize_t status_size;
static int class_truncate = -1, class_in_status = -1;

enum { K_COPY = 1, K_COMBINE = 3, K_CHECK = 4, K_CHECK_TAKE = 5 };
enum { E_BAIL = 1, E_TRUNCATED = 2, E_ERROR = 3 };
/* element types (lane.py's DTYPES) */
enum { D_F4 = 1, D_F8, D_I1, D_I2, D_I4, D_I8, D_U1, D_U2, D_U4, D_U8, D_B1, D_C8, D_C16 };
/* MPI's built-in ops: mpicomm.ops codes */
enum { O_SUM = 1, O_PROD, O_MIN, O_MAX, O_LAND, O_LOR, O_LXOR, O_BAND, O_BOR, O_BXOR };

typedef struct {
    int kind, op, dtype;
    char *a, *b, *out;   /* COPY: out <- a (count bytes) */
    Py_ssize_t count;    /* COMBINE: out = a op b (count elements); CHECK: a got, b own words */
} rec_t;

typedef struct {
    int nreq;
    char *reqs;          /* nreq handles */
    int npre, nwords, nops;
    rec_t *pre, *words, *ops;
    int early;
} step_t;

typedef struct {
    PyObject_HEAD
    int nsteps, nagree, a;
    step_t *steps, *agree;  /* the data steps; the agreement's own rounds (requests and words' checks only) */
    char *statuses;
    int last_rc;
    PyObject *keep;      /* what the records point into */
} Lane;

static PyTypeObject LaneType;

/* ---------------------------------------------------------------- the element loops */

#define LOOP(T, EXPR)                                                   \
    do {                                                                \
        const T *x = (const T *)r->a, *y = (const T *)r->b;             \
        T *o = (T *)r->out;                                             \
        for (Py_ssize_t i = 0; i < n; i++) { T a = x[i], b = y[i]; o[i] = (T)(EXPR); } \
    } while (0)

/* numpy's maximum/minimum: a NaN in a propagates, then one in b; of equal values (-0.0 and 0.0), b */
#define MAXF(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define MINF(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))

#define ARITH(T)                                                        \
    switch (r->op) {                                                    \
    case O_SUM: LOOP(T, a + b); return 0;                               \
    case O_PROD: LOOP(T, a * b); return 0;                              \
    case O_MIN: LOOP(T, MINF(a, b)); return 0;                          \
    case O_MAX: LOOP(T, MAXF(a, b)); return 0;                          \
    case O_LAND: LOOP(T, (a != 0) && (b != 0)); return 0;               \
    case O_LOR: LOOP(T, (a != 0) || (b != 0)); return 0;                \
    case O_LXOR: LOOP(T, (a != 0) != (b != 0)); return 0;               \
    default: return -1;                                                 \
    }

#define INTEGER(T)                                                      \
    switch (r->op) {                                                    \
    case O_BAND: LOOP(T, a & b); return 0;                              \
    case O_BOR: LOOP(T, a | b); return 0;                               \
    case O_BXOR: LOOP(T, a ^ b); return 0;                              \
    default: ARITH(T)                                                   \
    }

/* complex numbers as (re, im) pairs: sums only (NumPy's complex product may use fused multiply-adds where the
 * CPU has them, so its bits depend on the machine: that op stays NumPy's) */
#define COMPLEX(T)                                                                      \
    static int complex_##T(const rec_t *r) {                                            \
        const T *x = (const T *)r->a, *y = (const T *)r->b;                             \
        T *o = (T *)r->out;                                                             \
        if (r->op != O_SUM) return -1;                                                  \
        for (Py_ssize_t i = 0; i < 2 * r->count; i++) o[i] = x[i] + y[i];               \
        return 0;                                                                       \
    }
COMPLEX(float)
COMPLEX(double)
#define complex_loop(T, r) complex_##T(r)

static int combine(const rec_t *r) {
    Py_ssize_t n = r->count;
    switch (r->dtype) {
    case D_F4: ARITH(float)
    case D_F8: ARITH(double)
    case D_I1: INTEGER(int8_t)
    case D_I2: INTEGER(int16_t)
    case D_I4: INTEGER(int32_t)
    case D_I8: INTEGER(int64_t)
    case D_U1: INTEGER(uint8_t)
    case D_U2: INTEGER(uint16_t)
    case D_U4: INTEGER(uint32_t)
    case D_U8: INTEGER(uint64_t)
    case D_B1:
        switch (r->op) {
        case O_LAND: case O_BAND: case O_MIN: case O_PROD: LOOP(uint8_t, (a != 0) & (b != 0)); return 0;
        case O_LOR: case O_BOR: case O_MAX: case O_SUM: LOOP(uint8_t, (a != 0) | (b != 0)); return 0;
        case O_LXOR: case O_BXOR: LOOP(uint8_t, (a != 0) ^ (b != 0)); return 0;
        default: return -1;
        }
    case D_C8: return complex_loop(float, r);
    case D_C16: return complex_loop(double, r);
    default: return -1;
    }
}

/* Which (op, dtype) pairs combine() computes: the same table, asked without data. */
static int supported(int op, int dtype) {
    if (dtype < D_F4 || dtype > D_C16 || op < O_SUM || op > O_BXOR) return 0;
    if (dtype == D_C8 || dtype == D_C16) return op == O_SUM;
    if (dtype == D_F4 || dtype == D_F8) return op <= O_LXOR;
    return 1;
}

static void run_records(const rec_t *r, int n) {
    for (int i = 0; i < n; i++, r++) {
        switch (r->kind) {
        case K_COPY: memmove(r->out, r->a, (size_t)r->count); break;
        case K_COMBINE: combine(r); break;
        default: break;
        }
    }
}

/* The agreement words a fused step received equal this rank's own: nothing to combine (the common case).
 * CHECK (fold/both): equal and a cross word of 0; CHECK_TAKE (recv): equal. */
static int words_agree(const rec_t *r, int n) {
    for (int i = 0; i < n; i++, r++) {
        if (memcmp(r->a, r->b, 32) != 0) return 0;
        if (r->kind == K_CHECK && ((const int64_t *)r->a)[3] != 0) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- the loop (no Python: called without the GIL) */

static int is_truncation(int rc) {
    int cls = rc;
    if (mpi_error_class != NULL) mpi_error_class(rc, &cls);
    return cls == class_truncate || cls == class_in_status;
}

static int post(Lane *self, int k) {
    step_t *s = &self->steps[k];
    run_records(s->pre, s->npre);
    if (s->nreq) return mpi_startall(s->nreq, s->reqs);
    return 0;
}

static long event(int e, int k) { return -2 - ((long)k * 4 + e); }

/* Test (or, when *wait, wait for) n requests: 1 complete, 0 not yet, -1 an MPI error (in last_rc). */
static int finished(Lane *self, int n, char *reqs, int wait) {
    int flag = 0, rc;
    if (wait) {
        rc = mpi_waitall(n, reqs, self->statuses);
        flag = 1;
    } else {
        rc = mpi_testall(n, reqs, &flag, self->statuses);
    }
    if (rc) {
        self->last_rc = rc;
        return -1;
    }
    return flag;
}

static long failed(Lane *self, int k) {
    return event(is_truncation(self->last_rc) ? E_TRUNCATED : E_ERROR, k);
}

/* Post step *next* if the program has one: 0, or the error event (MPI's code in last_rc). */
static long post_next(Lane *self, int next) {
    if (next >= self->nsteps) return 0;
    int rc = post(self, next);
    if (!rc) return 0;
    self->last_rc = rc;
    return event(E_ERROR, next);
}

/* The loop: the agreement's own rounds (self->a: the round in flight, -1 none) advance beside the data steps
 * (k: the step whose requests are in flight), as the Python executor's _poll does. Blocking, a wait sleeps in
 * MPI_Waitall after `spins` fruitless tests: on the agreement's round while one is in flight (it always
 * completes, whatever the peers run), else on the data step's requests. */
static long advance(Lane *self, int k, long spins, int block) {
    int n = self->nsteps;
    long idle = 0;
    for (;;) {
        int moved = 0;
        while (self->a >= 0) {
            step_t *g = &self->agree[self->a];
            int wait = block && idle >= spins;
            int done = finished(self, g->nreq, g->reqs, wait);
            if (done < 0) return failed(self, k);
            if (!done) break;
            if (!words_agree(g->words, g->nwords)) return event(E_BAIL, k);
            moved = 1;
            idle = 0;
            if (++self->a == self->nagree) {
                self->a = -1;
                break;
            }
            int rc = mpi_startall(self->agree[self->a].nreq, self->agree[self->a].reqs);
            if (rc) {
                self->last_rc = rc;
                return event(E_ERROR, k);
            }
        }
        if (k < n) {
            step_t *s = &self->steps[k];
            if (s->nreq) {
                int wait = block && idle >= spins && self->a < 0;
                int done = finished(self, s->nreq, s->reqs, wait);
                if (done < 0) return failed(self, k);
                if (!done) {
                    if (!block && !moved) return k;
                    if (!moved) idle++;
                    continue;
                }
            }
            if (s->nwords && !words_agree(s->words, s->nwords)) return event(E_BAIL, k);
            int next = k + 1;
            long e;  /* the next step is posted before this one's ops where they touch different memory */
            if (s->early && (e = post_next(self, next))) return e;
            run_records(s->ops, s->nops);
            if (!s->early && (e = post_next(self, next))) return e;
            k = next;
            idle = 0;
            continue;
        }
        if (self->a < 0) return -1;
        if (!block && !moved) return n;
        if (!moved) idle++;
    }
}

/* ---------------------------------------------------------------- the Python type */

static int read_records(PyObject *seq, rec_t **out, int *n) {
    PyObject *fast = PySequence_Fast(seq, "records must be a sequence");
    if (fast == NULL) return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    *n = (int)m;
    *out = m ? PyMem_Calloc((size_t)m, sizeof(rec_t)) : NULL;
    if (m && *out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        rec_t *r = &(*out)[i];
        unsigned long long a, b, o;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iiiKKKn", &r->kind, &r->op, &r->dtype, &a, &b,
                              &o, &r->count)) {
            Py_DECREF(fast);
            return -1;
        }
        r->a = (char *)(uintptr_t)a;
        r->b = (char *)(uintptr_t)b;
        r->out = (char *)(uintptr_t)o;
        if (r->kind == K_COMBINE && !supported(r->op, r->dtype)) {
            PyErr_Format(PyExc_ValueError, "the lane does not compute op %d on element type %d", r->op, r->dtype);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static void free_steps(step_t *steps, int n) {
    for (int k = 0; k < n && steps; k++) {
        PyMem_Free(steps[k].reqs);
        PyMem_Free(steps[k].pre);
        PyMem_Free(steps[k].words);
        PyMem_Free(steps[k].ops);
    }
    PyMem_Free(steps);
}

static void Lane_dealloc(Lane *self) {
    free_steps(self->steps, self->nsteps);
    free_steps(self->agree, self->nagree);
    PyMem_Free(self->statuses);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Read a sequence of steps: (handles, nreq, pre, words, ops, early) each (an agreement round: (handles, nreq,
 * words)). Returns the most requests of a step, or -1. */
static int read_steps(PyObject *seq, step_t **out, int *count, int agree) {
    PyObject *fast = PySequence_Fast(seq, "steps must be a sequence");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *out = n ? PyMem_Calloc((size_t)n, sizeof(step_t)) : NULL;
    if (n && *out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    *count = (int)n;
    int most = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        step_t *s = &(*out)[k];
        const char *handles;
        Py_ssize_t length;
        PyObject *pre = NULL, *words = NULL, *ops = NULL;
        PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
        int ok = agree ? PyArg_ParseTuple(item, "y#iO", &handles, &length, &s->nreq, &words)
                       : PyArg_ParseTuple(item, "y#iOOOp", &handles, &length, &s->nreq, &pre, &words, &ops, &s->early);
        if (!ok) goto fail;
        s->reqs = length ? PyMem_Malloc((size_t)length) : NULL;
        if (length && s->reqs == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        if (length) memcpy(s->reqs, handles, (size_t)length);
        if (s->nreq > most) most = s->nreq;
        if (read_records(words, &s->words, &s->nwords)) goto fail;
        if (!agree && (read_records(pre, &s->pre, &s->npre) || read_records(ops, &s->ops, &s->nops))) goto fail;
    }
    Py_DECREF(fast);
    return most;
fail:
    Py_DECREF(fast);
    return -1;
}

/* Lane(steps, agree, keep): the data steps and the agreement's own rounds (see read_steps), the records
 * (kind, op, dtype, a, b, out, count); keep: what the records' addresses point into. */
static int Lane_init(Lane *self, PyObject *args, PyObject *kwds) {
    PyObject *steps, *agree, *keep;
    if (!PyArg_ParseTuple(args, "OOO", &steps, &agree, &keep)) return -1;
    if (mpi_startall == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpicomm.engine._lane: bind() the MPI library first");
        return -1;
    }
    if (self->steps || self->agree) {
        PyErr_SetString(PyExc_RuntimeError, "a Lane is made once");
        return -1;
    }
    self->a = -1;
    int most = read_steps(steps, &self->steps, &self->nsteps, 0);
    if (most < 0) return -1;
    int more = read_steps(agree, &self->agree, &self->nagree, 1);
    if (more < 0) return -1;
    if (more > most) most = more;
    self->statuses = PyMem_Calloc((size_t)(most ? most : 1), (size_t)status_size);
    if (self->statuses == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(keep);
    self->keep = keep;
    return 0;
}

/* agree(): start the agreement's first round (a run's start); returns MPI's error code (0). */
static PyObject *Lane_agree(Lane *self, PyObject *unused) {
    if (!self->nagree) {
        self->a = -1;
        return PyLong_FromLong(0);
    }
    self->a = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mpi_startall(self->agree[0].nreq, self->agree[0].reqs);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *Lane_post(Lane *self, PyObject *arg) {
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k < 0 || k >= self->nsteps) return PyErr_Format(PyExc_IndexError, "step %ld of %d", k, self->nsteps);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = post(self, (int)k);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *Lane_advance(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "advance(k, spins, block) takes 3 arguments");
    long k = PyLong_AsLong(args[0]);
    long spins = PyLong_AsLong(args[1]);
    int block = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (k < 0 || k > self->nsteps) return PyErr_Format(PyExc_IndexError, "step %ld of %d", k, self->nsteps);
    long r;
    Py_BEGIN_ALLOW_THREADS
    r = advance(self, (int)k, spins < 1 ? 1 : spins, block);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

/* nap(runs, seconds, gap): the progress thread's wait between its looks at the queues, spent polling runs without
 * the GIL. *runs*: a sequence of (lane, k, waiters), one per queue whose lock the thread holds: the run's lane, the
 * step its requests are in flight for, and the address of the queue's int64 count of threads waiting for its lock.
 * Nonblocking advances of each in turn, 1 us apart at first and at most *gap* seconds apart, until one run moves
 * (a step or an agreement round completes, it ends or hands itself back), *seconds* have passed, or another thread
 * waits for one of the queues (its count non-zero). Returns (i, r): the run that moved or whose queue is wanted and
 * advance()'s answer for it, or (-1, 0) when time was up. */
#define NAP_MOST 64
static PyObject *py_nap(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "nap(runs, seconds, gap) takes 3 arguments");
    double seconds = PyFloat_AsDouble(args[1]);
    double most = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "nap: runs must be a sequence of (lane, k, waiters)");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > NAP_MOST) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "nap: %zd runs (1 to %d)", n, NAP_MOST);
    }
    Lane *lanes[NAP_MOST];
    int ks[NAP_MOST], as[NAP_MOST];
    volatile int64_t *waiters[NAP_MOST];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *lane;
        long k;
        unsigned long long address;
        if (!PyArg_ParseTuple(item, "O!lK", &LaneType, &lane, &k, &address)) {
            Py_DECREF(seq);
            return NULL;
        }
        Lane *l = (Lane *)lane;
        if (k < 0 || k > l->nsteps) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_IndexError, "nap: run %zd at step %ld of %d", i, k, l->nsteps);
        }
        lanes[i] = l;
        ks[i] = (int)k;
        as[i] = l->a;
        waiters[i] = (volatile int64_t *)(uintptr_t)address;
    }
    long r = 0;
    Py_ssize_t moved = -1;
    Py_BEGIN_ALLOW_THREADS
    struct timespec begun, now;
    clock_gettime(CLOCK_MONOTONIC, &begun);
    long gap = 1000, cap = (long)(most * 1e9);  /* ns */
    if (cap < 1000) cap = 1000;
    if (cap > 999999999) cap = 999999999;
    for (;;) {
        for (Py_ssize_t i = 0; i < n && moved < 0; i++) {
            r = advance(lanes[i], ks[i], 1, 0);
            if (r != ks[i] || lanes[i]->a != as[i] || *waiters[i]) moved = i;
        }
        if (moved >= 0) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double spent = (double)(now.tv_sec - begun.tv_sec) + 1e-9 * (double)(now.tv_nsec - begun.tv_nsec);
        if (spent >= seconds) break;
        struct timespec pause = {0, gap};
        nanosleep(&pause, NULL);
        if (gap < cap) gap = gap * 2 < cap ? gap * 2 : cap;
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(seq);  /* (the lanes stay alive: the caller's runs hold them) */
    return Py_BuildValue("(nl)", moved, moved < 0 ? 0L : r);
}

/* start(spins, block): a run's start - the agreement's first round, the first data step - then advance(0, spins,
 * block), in one call. */
static PyObject *Lane_start(Lane *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "start(spins, block) takes 2 arguments");
    long spins = PyLong_AsLong(args[0]);
    int block = PyObject_IsTrue(args[1]);
    if (PyErr_Occurred()) return NULL;
    long r;
    Py_BEGIN_ALLOW_THREADS
    int rc = 0;
    self->a = self->nagree ? 0 : -1;
    if (self->nagree) rc = mpi_startall(self->agree[0].nreq, self->agree[0].reqs);
    if (!rc && self->nsteps) rc = post(self, 0);
    if (rc) {
        self->last_rc = rc;
        r = event(E_ERROR, 0);
    } else {
        r = advance(self, 0, spins < 1 ? 1 : spins, block);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

static PyObject *Lane_get_rc(Lane *self, void *closure) { return PyLong_FromLong(self->last_rc); }
static PyObject *Lane_get_steps(Lane *self, void *closure) { return PyLong_FromLong(self->nsteps); }
static PyObject *Lane_get_a(Lane *self, void *closure) { return PyLong_FromLong(self->a); }

static PyMethodDef Lane_methods[] = {
    {"post", (PyCFunction)Lane_post, METH_O, "post(k): run step k's posting records and start its requests; "
                                              "returns MPI's error code (0)."},
    {"agree", (PyCFunction)Lane_agree, METH_NOARGS, "agree(): start the agreement's first round."},
    {"start", (PyCFunction)(void (*)(void))Lane_start, METH_FASTCALL,
     "start(spins, block): start a run (the agreement's first round, the first step) and advance(0, ...)."},
    {"advance", (PyCFunction)(void (*)(void))Lane_advance, METH_FASTCALL,
     "advance(k, spins, block): run from step k (its requests started) as far as possible; see the module."},
    {NULL}};

static PyGetSetDef Lane_getset[] = {
    {"last_rc", (getter)Lane_get_rc, NULL, "the MPI error code of the last error event", NULL},
    {"steps", (getter)Lane_get_steps, NULL, "the number of steps", NULL},
    {"a", (getter)Lane_get_a, NULL, "the agreement's round in flight (-1: none)", NULL},
    {NULL}};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpicomm.engine._lane.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A program's data steps as records, run without the GIL (see the module).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
};

/* bind(startall, testall, waitall, error_class, status_size, ERR_TRUNCATE, ERR_IN_STATUS): the addresses of
 * MPI_Startall, MPI_Testall, MPI_Waitall and MPI_Error_class in the library mpi4py loaded. */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long s, t, w, e;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "KKKKnii", &s, &t, &w, &e, &size, &class_truncate, &class_in_status)) return NULL;
    if (!s || !t || !w || size <= 0) return PyErr_Format(PyExc_ValueError, "bind: a missing MPI function");
    mpi_startall = (startall_t)(uintptr_t)s;
    mpi_testall = (testall_t)(uintptr_t)t;
    mpi_waitall = (waitall_t)(uintptr_t)w;
    mpi_error_class = (errclass_t)(uintptr_t)e;
    status_size = size;
    Py_RETURN_NONE;
}

static PyObject *py_supported(PyObject *module, PyObject *args) {
    int op, dtype;
    if (!PyArg_ParseTuple(args, "ii", &op, &dtype)) return NULL;
    return PyBool_FromLong(supported(op, dtype));
}

/* combine(op, dtype, a, b, out, count): one reduction record, run at once (for the tests). */
static PyObject *py_combine(PyObject *module, PyObject *args) {
    rec_t r = {K_COMBINE, 0, 0, NULL, NULL, NULL, 0};
    unsigned long long a, b, o;
    if (!PyArg_ParseTuple(args, "iiKKKn", &r.op, &r.dtype, &a, &b, &o, &r.count)) return NULL;
    if (!supported(r.op, r.dtype)) return PyErr_Format(PyExc_ValueError, "op %d on element type %d", r.op, r.dtype);
    r.a = (char *)(uintptr_t)a;
    r.b = (char *)(uintptr_t)b;
    r.out = (char *)(uintptr_t)o;
    Py_BEGIN_ALLOW_THREADS
    combine(&r);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- reproducible sums (mpicomm.reproducible)
 *
 * The host kernels of mpicomm/reproducible.py: the same operations in the same order as its array-module code
 * (which device arrays run), so every rank gives the same bits whichever runs. Exponents as int16 (-32768: 0,
 * 32767: inf or NaN), B = 40-bit digits, specials counted in the first digit (+inf 1, -inf 2^21, NaN 2^42). */

#define R_BITS 40
#define R_ZERO (-32768)
#define R_SPECIAL 32767
#define R_RADIX 1099511627776.0 /* 2^40 */

static inline double r_pow2(int k) { /* 2^k, -1022 <= k <= 1023 */
    union { uint64_t u; double d; } v;
    v.u = (uint64_t)(k + 1023) << 52;
    return v.d;
}

static inline double r_scale(double x, int k) { /* x 2^k by two exact factors, as reproducible._scale */
    int h = k >> 1;
    return x * r_pow2(h) * r_pow2(k - h);
}

static inline double r_load(const void *restrict x, int f32, Py_ssize_t i) {
    return f32 ? (double)((const float *)x)[i] : ((const double *)x)[i];
}

/* Each kernel is written once, for any (f32, k), and inlined into one function per combination (the
 * dispatchers below), so that the element loops carry no branch on them and their pointers do not alias. */
#define R_INLINE static inline __attribute__((always_inline))

R_INLINE void r_exponents(const void *restrict x, int f32, int16_t *restrict e, Py_ssize_t n) {
    int odd = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* (branch-free: zeros, subnormals and specials are a second pass) */
        union { double d; uint64_t u; } bits = {r_load(x, f32, i)};
        int biased = (int)((bits.u >> 52) & 0x7ff);
        odd |= (biased == 0) | (biased == 0x7ff);
        e[i] = (int16_t)(biased - 1022); /* (frexp's exponent of a normal number) */
    }
    if (!odd) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = r_load(x, f32, i);
        union { double d; uint64_t u; } bits = {v};
        int biased = (int)((bits.u >> 52) & 0x7ff), ex = 0;
        if (biased == 0x7ff) e[i] = R_SPECIAL;
        else if (biased != 0) continue;
        else if (v == 0) e[i] = R_ZERO;
        else {
            frexp(v, &ex); /* (a subnormal float64) */
            e[i] = (int16_t)ex;
        }
    }
}

R_INLINE void r_digits(const void *restrict x, int f32, const int16_t *restrict e, int64_t *restrict out, Py_ssize_t n,
                       int k) {
    int specials = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* (branch-free: the specials are a second pass) */
        int E = e[i];
        int ordinary = (E != R_ZERO) & (E != R_SPECIAL);
        specials |= E == R_SPECIAL;
        /* x, or 0 where E is not ordinary, selected by masks (no control flow: the loop vectorises) */
        union { double d; uint64_t u; } v = {r_load(x, f32, i)};
        v.u &= -(uint64_t)ordinary;
        double t = r_scale(v.d, (R_BITS - E) & -ordinary);
        int64_t d = (int64_t)t; /* (truncates, as trunc: |t| < 2^40) */
        out[i * k] = d;
        if (k == 2) out[i * 2 + 1] = (int64_t)((t - (double)d) * R_RADIX);
    }
    if (!specials) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (e[i] != R_SPECIAL) continue;
        double v = r_load(x, f32, i);
        out[i * k] = isnan(v) ? (int64_t)1 << 42 : v == INFINITY ? 1 : v == -INFINITY ? (int64_t)1 << 21 : 0;
    }
}

R_INLINE void r_finish(const int64_t *restrict s, const int16_t *restrict e, void *restrict out, int f32, Py_ssize_t n,
                       int k) {
    int odd = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* (branch-free: zeros and specials are a second pass) */
        int E = e[i];
        odd |= (E == R_ZERO) | (E == R_SPECIAL);
        if (k == 1) {
            int sc = E - R_BITS, h = sc >> 1;
            ((float *)out)[i] = (float)s[i] * (float)r_pow2(h) * (float)r_pow2(sc - h);
        } else {
            int64_t hi = s[i * 2], lo = s[i * 2 + 1];
            int64_t carry = lo >> R_BITS; /* (arithmetic: floor) */
            lo -= carry * ((int64_t)1 << R_BITS);
            hi += carry;
            double a = (double)hi;
            int64_t b = (hi - (int64_t)a) * ((int64_t)1 << R_BITS) + lo;
            int sc = E - 2 * R_BITS;
            if (sc < -2200) sc = 0; /* (a zero or special element: set below) */
            ((double *)out)[i] = r_scale(a * R_RADIX + (double)b, sc);
        }
    }
    if (!odd) return;
    for (Py_ssize_t i = 0; i < n; i++) {
        int E = e[i];
        double v;
        if (E == R_ZERO) v = 0;
        else if (E == R_SPECIAL) {
            int64_t first = s[i * k], mask = ((int64_t)1 << 21) - 1;
            int64_t pos = first & mask, neg = (first >> 21) & mask, nan = first >> 42;
            v = (nan > 0 || (pos > 0 && neg > 0)) ? NAN : pos > 0 ? INFINITY : -INFINITY;
        } else continue;
        if (f32) ((float *)out)[i] = (float)v;
        else ((double *)out)[i] = v;
    }
}

/* Each compiled for the baseline and for AVX2 and AVX-512 machines, chosen at load time (the same results: the
 * operations are IEEE's and the conversions truncate alike; -ffp-contract=off keeps them apart). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__GLIBC__)
#define R_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define R_CLONES
#endif

R_CLONES static void r_exponents32(const void *x, int16_t *e, Py_ssize_t n) { r_exponents(x, 1, e, n); }
R_CLONES static void r_exponents64(const void *x, int16_t *e, Py_ssize_t n) { r_exponents(x, 0, e, n); }
R_CLONES static void r_digits32(const void *x, const int16_t *e, int64_t *o, Py_ssize_t n) { r_digits(x, 1, e, o, n, 1); }
R_CLONES static void r_digits64(const void *x, const int16_t *e, int64_t *o, Py_ssize_t n) { r_digits(x, 0, e, o, n, 2); }
R_CLONES static void r_finish32(const int64_t *s, const int16_t *e, void *o, Py_ssize_t n) { r_finish(s, e, o, 1, n, 1); }
R_CLONES static void r_finish64(const int64_t *s, const int16_t *e, void *o, Py_ssize_t n) { r_finish(s, e, o, 0, n, 2); }

/* repro(what, f32, k, n, a, b, c): what 0: exponents of x=a into e=b; 1: digits of x=a on e=b into c;
 * 2: the rounded sums a on e=b into c. Arrays by the buffer protocol (C-contiguous; b and c written where they
 * are outputs), their sizes checked against n; the GIL released while the kernel runs. */
static PyObject *py_repro(PyObject *module, PyObject *args) {
    int what, f32, k;
    Py_ssize_t n;
    PyObject *oa, *ob, *oc;
    if (!PyArg_ParseTuple(args, "iiinOOO", &what, &f32, &k, &n, &oa, &ob, &oc)) return NULL;
    if (k != (f32 ? 1 : 2) || what < 0 || what > 2 || n < 0) /* (k: reproducible.DIGITS) */
        return PyErr_Format(PyExc_ValueError, "repro: what %d, k %d, n %zd", what, k, n);
    Py_ssize_t real = f32 ? 4 : 8;
    /* the bytes each array needs, and whether it is written */
    Py_ssize_t need_a = what == 2 ? n * k * 8 : n * real, need_b = n * 2, need_c = what == 0 ? 0 : what == 1 ? n * k * 8 : n * real;
    Py_buffer va, vb, vc;
    if (PyObject_GetBuffer(oa, &va, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(ob, &vb, PyBUF_C_CONTIGUOUS | (what == 0 ? PyBUF_WRITABLE : 0)) < 0) {
        PyBuffer_Release(&va);
        return NULL;
    }
    if (PyObject_GetBuffer(oc, &vc, PyBUF_C_CONTIGUOUS | (what == 0 ? 0 : PyBUF_WRITABLE)) < 0) {
        PyBuffer_Release(&va);
        PyBuffer_Release(&vb);
        return NULL;
    }
    PyObject *result = Py_None;
    if (va.len < need_a || vb.len < need_b || vc.len < need_c) {
        PyErr_Format(PyExc_ValueError, "repro: arrays of %zd, %zd and %zd bytes for %zd elements (need %zd, %zd, %zd)",
                     va.len, vb.len, vc.len, n, need_a, need_b, need_c);
        result = NULL;
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (what == 0) (f32 ? r_exponents32 : r_exponents64)(va.buf, (int16_t *)vb.buf, n);
        else if (what == 1) (f32 ? r_digits32 : r_digits64)(va.buf, (const int16_t *)vb.buf, (int64_t *)vc.buf, n);
        else (f32 ? r_finish32 : r_finish64)((const int64_t *)va.buf, (const int16_t *)vb.buf, vc.buf, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&va);
    PyBuffer_Release(&vb);
    PyBuffer_Release(&vc);
    if (result != NULL) Py_INCREF(result);
    return result;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "Bind the MPI library's functions (see mpicomm.engine.lane)."},
    {"supported", py_supported, METH_VARARGS, "supported(op, dtype): whether the lane computes that reduction."},
    {"combine", py_combine, METH_VARARGS, "combine(op, dtype, a, b, out, count): one reduction, by address."},
    {"repro", py_repro, METH_VARARGS,
     "repro(what, f32, k, n, a, b, c): a reproducible sum's exponents, digits or rounding (mpicomm.reproducible)."},
    {"nap", (PyCFunction)(void (*)(void))py_nap, METH_FASTCALL,
     "nap(runs, seconds, gap): poll several runs' lanes without the GIL until one moves, time is up or a thread "
     "waits for one of their queues; (i, r) (see the source)."},
    {NULL}};

static struct PyModuleDef lane_module = {PyModuleDef_HEAD_INIT, "_lane",
                                         "The compiled executor's lane (see mpicomm.engine.lane).", -1,
                                         module_methods};

PyMODINIT_FUNC PyInit__lane(void) {
    if (PyType_Ready(&LaneType) < 0) return NULL;
    PyObject *m = PyModule_Create(&lane_module);
    if (m == NULL) return NULL;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
