/* The pack's own kernel launcher (see kernels/_claunch.py): one call from Python per launch,
 * kernel arguments packed here from a per-kernel list of kinds, then one driver call.
 *
 * Launcher(function, launch, ctx, block_x, shared, kinds, extra, ex=False)
 *   function  CUfunction handle of a loaded kernel (an int)
 *   launch    address of a function with cuLaunchKernel's signature (ex: cuLaunchKernelEx's, given a
 *             config without attributes)
 *   ctx       address of a function with cuCtxGetCurrent's signature, or 0 (no check)
 *   block_x   threads per block (32 * num_warps); shared: dynamic shared memory bytes
 *   kinds     bytes, one per argument the caller passes (constexprs included):
 *               x  a constexpr: not a kernel parameter, the value is ignored
 *               z  a constexpr None (an absent optional pointer): must be None
 *               p  a pointer: a tensor (its data_ptr()) or an int; None is refused
 *               n  a pointer that may be None (null)
 *               b i8, h i16, i i32, l i64, I u32, L u64, f fp32, d fp64: scalars, range-checked
 *   extra     trailing null pointer parameters (Triton's global and profile scratch)
 *
 * launcher(grid, stream, *args): grid a 3-tuple of ints, stream an int. Returns None when
 * launched (or when the grid is empty), False without launching when `ctx` reports no
 * current CUDA context on this thread (the caller then launches through Triton, which makes
 * one current). Every argument error raises before the driver is called.
 *
 * No CUDA header is needed: the driver functions arrive as addresses (kernels/_claunch.py
 * takes them from libcuda with ctypes), so this file also builds and is tested on machines
 * without CUDA, against the recording launch function below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARAMS 128

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void *stream, void **params, void **extra);
typedef int (*ctx_fn)(void **ctx);
/* cuLaunchKernelEx's config, laid out as cuda.h's CUlaunchConfig (no attributes used) */
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} launch_config;
typedef int (*launch_ex_fn)(const launch_config *config, void *f, void **params, void **extra);

typedef union {
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t i64;
    uint32_t u32;
    uint64_t u64;
    float f32;
    double f64;
} slot_t;

typedef struct {
    PyObject_HEAD
    void *function;
    launch_fn launch;
    launch_ex_fn launch_ex;
    ctx_fn ctx;
    unsigned block_x;
    unsigned shared;
    Py_ssize_t nargs;
    int extra;
    char kinds[MAX_PARAMS];
} Launcher;

static PyObject *s_data_ptr = NULL;
static int g_last_nparams = 0; /* read by the recording launch function (tests) */

static int pointer_of(PyObject *obj, Py_ssize_t i, slot_t *out) {
    PyObject *v;
    if (PyLong_Check(obj)) {
        v = obj;
        Py_INCREF(v);
    } else {
        v = PyObject_CallMethodNoArgs(obj, s_data_ptr);
        if (v == NULL) {
            PyErr_Format(PyExc_TypeError, "swa_backends launcher: argument %zd must be a tensor or an int pointer, "
                         "got %s", i, Py_TYPE(obj)->tp_name);
            return -1;
        }
    }
    out->u64 = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

static int signed_of(PyObject *obj, Py_ssize_t i, long long lo, long long hi, const char *ty, long long *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "swa_backends launcher: argument %zd does not fit in %s", i, ty);
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *Launcher_call(Launcher *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) || n != self->nargs + 2) {
        PyErr_Format(PyExc_TypeError, "swa_backends launcher: takes (grid, stream, %zd kernel arguments), got %zd "
                     "positional arguments", self->nargs, n);
        return NULL;
    }
    PyObject *grid = PyTuple_GET_ITEM(args, 0);
    if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3) {
        PyErr_SetString(PyExc_TypeError, "swa_backends launcher: grid must be a tuple of 3 ints");
        return NULL;
    }
    unsigned long g[3];
    for (int d = 0; d < 3; d++) {
        g[d] = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(grid, d));
        if (PyErr_Occurred())
            return NULL;
        if (g[d] > 0x7fffffffUL) {
            PyErr_Format(PyExc_OverflowError, "swa_backends launcher: grid[%d] = %lu is too large", d, g[d]);
            return NULL;
        }
    }
    void *stream = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, 1));
    if (PyErr_Occurred())
        return NULL;

    slot_t vals[MAX_PARAMS];
    void *params[MAX_PARAMS];
    int p = 0;
    for (Py_ssize_t i = 0; i < self->nargs; i++) {
        PyObject *obj = PyTuple_GET_ITEM(args, i + 2);
        char kind = self->kinds[i];
        long long v;
        if (kind == 'x')
            continue;
        if (kind == 'z') {
            if (obj != Py_None) {
                PyErr_Format(PyExc_TypeError, "swa_backends launcher: argument %zd was None when this kernel was "
                             "compiled and must stay None (got %s)", i, Py_TYPE(obj)->tp_name);
                return NULL;
            }
            continue;
        }
        slot_t *s = &vals[p];
        s->u64 = 0;
        switch (kind) {
        case 'n':
            if (obj == Py_None)
                break;
            /* fall through */
        case 'p':
            if (obj == Py_None) {
                PyErr_Format(PyExc_TypeError, "swa_backends launcher: argument %zd is a pointer; got None", i);
                return NULL;
            }
            if (pointer_of(obj, i, s) < 0)
                return NULL;
            break;
        case 'b':
            if (signed_of(obj, i, INT8_MIN, INT8_MAX, "int8", &v) < 0) return NULL;
            s->i8 = (int8_t)v;
            break;
        case 'h':
            if (signed_of(obj, i, INT16_MIN, INT16_MAX, "int16", &v) < 0) return NULL;
            s->i16 = (int16_t)v;
            break;
        case 'i':
            if (signed_of(obj, i, INT32_MIN, INT32_MAX, "int32", &v) < 0) return NULL;
            s->i32 = (int32_t)v;
            break;
        case 'l':
            if (signed_of(obj, i, INT64_MIN, INT64_MAX, "int64", &v) < 0) return NULL;
            s->i64 = (int64_t)v;
            break;
        case 'I':
            if (signed_of(obj, i, 0, UINT32_MAX, "uint32", &v) < 0) return NULL;
            s->u32 = (uint32_t)v;
            break;
        case 'L':
            s->u64 = PyLong_AsUnsignedLongLong(obj);
            if (PyErr_Occurred()) return NULL;
            break;
        case 'f':
            s->f32 = (float)PyFloat_AsDouble(obj);
            if (PyErr_Occurred()) return NULL;
            break;
        case 'd':
            s->f64 = PyFloat_AsDouble(obj);
            if (PyErr_Occurred()) return NULL;
            break;
        default:
            PyErr_Format(PyExc_SystemError, "swa_backends launcher: unknown kind %c", kind);
            return NULL;
        }
        params[p] = s;
        p++;
    }
    for (int e = 0; e < self->extra; e++) {
        vals[p].u64 = 0;
        params[p] = &vals[p];
        p++;
    }
    if (g[0] == 0 || g[1] == 0 || g[2] == 0)
        Py_RETURN_NONE;
    if (self->ctx != NULL) {
        void *ctx = NULL;
        if (self->ctx(&ctx) != 0 || ctx == NULL)
            Py_RETURN_FALSE;
    }
    g_last_nparams = p;
    int rc;
    if (self->launch_ex != NULL) {
        launch_config config = {(unsigned)g[0], (unsigned)g[1], (unsigned)g[2], self->block_x, 1, 1, self->shared,
                                stream, NULL, 0};
        rc = self->launch_ex(&config, self->function, params, NULL);
    } else {
        rc = self->launch(self->function, (unsigned)g[0], (unsigned)g[1], (unsigned)g[2], self->block_x, 1, 1,
                          self->shared, stream, params, NULL);
    }
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "swa_backends launcher: %s returned CUresult %d",
                     self->launch_ex != NULL ? "cuLaunchKernelEx" : "cuLaunchKernel", rc);
        return NULL;
    }
    Py_RETURN_NONE;
}

static int Launcher_init(Launcher *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"function", "launch", "ctx", "block_x", "shared", "kinds", "extra", "ex", NULL};
    unsigned long long function, launch, ctx;
    unsigned int block_x, shared;
    const char *kinds;
    Py_ssize_t nkinds;
    int extra, ex = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKIIy#i|p", names, &function, &launch, &ctx, &block_x, &shared,
                                     &kinds, &nkinds, &extra, &ex))
        return -1;
    if (launch == 0) {
        PyErr_SetString(PyExc_ValueError, "Launcher: launch must be the address of a launch function, got 0");
        return -1;
    }
    if (block_x == 0 || block_x > 1024) {
        PyErr_Format(PyExc_ValueError, "Launcher: block_x = %u, expected 1..1024 threads", block_x);
        return -1;
    }
    if (extra < 0) {
        PyErr_Format(PyExc_ValueError, "Launcher: extra = %d, expected >= 0", extra);
        return -1;
    }
    int params = extra;
    for (Py_ssize_t i = 0; i < nkinds; i++) {
        if (!strchr("xzpnbhilILfd", kinds[i]) || kinds[i] == '\0') {
            PyErr_Format(PyExc_ValueError, "Launcher: kinds[%zd] = %c, expected one of xzpnbhilILfd", i, kinds[i]);
            return -1;
        }
        params += kinds[i] != 'x' && kinds[i] != 'z';
    }
    if (nkinds > MAX_PARAMS || params > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "Launcher: %zd arguments / %d parameters, at most %d", nkinds, params,
                     MAX_PARAMS);
        return -1;
    }
    self->function = (void *)(uintptr_t)function;
    self->launch = ex ? NULL : (launch_fn)(uintptr_t)launch;
    self->launch_ex = ex ? (launch_ex_fn)(uintptr_t)launch : NULL;
    self->ctx = (ctx_fn)(uintptr_t)ctx;
    self->block_x = block_x;
    self->shared = shared;
    self->nargs = nkinds;
    self->extra = extra;
    memcpy(self->kinds, kinds, (size_t)nkinds);
    return 0;
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_swa_claunch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel launch with its arguments packed in C (see the module's source).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_call = (ternaryfunc)Launcher_call,
};

/* ---- test doubles: a launch function that records, a context getter that can say "none" ---- */

static struct {
    void *function;
    unsigned grid[3], block[3], shared;
    void *stream;
    int nparams;
    uint64_t params[MAX_PARAMS];
    long calls;
} g_rec;
static int g_ctx_present = 1;
static int g_launch_result = 0;

static int record_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void *stream, void **params, void **extra) {
    (void)extra;
    g_rec.function = f;
    g_rec.grid[0] = gx; g_rec.grid[1] = gy; g_rec.grid[2] = gz;
    g_rec.block[0] = bx; g_rec.block[1] = by; g_rec.block[2] = bz;
    g_rec.shared = shared;
    g_rec.stream = stream;
    g_rec.nparams = g_last_nparams;
    for (int i = 0; i < g_last_nparams; i++)
        memcpy(&g_rec.params[i], params[i], sizeof(uint64_t));
    g_rec.calls++;
    return g_launch_result;
}

static int record_launch_ex(const launch_config *c, void *f, void **params, void **extra) {
    return record_launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                         c->sharedMemBytes, c->hStream, params, extra);
}

static int fake_ctx(void **ctx) {
    *ctx = g_ctx_present ? (void *)&g_rec : NULL;
    return 0;
}

static PyObject *py_test_doubles(PyObject *mod, PyObject *args) {
    int ctx_present = 1, launch_result = 0;
    if (!PyArg_ParseTuple(args, "|ii", &ctx_present, &launch_result))
        return NULL;
    g_ctx_present = ctx_present;
    g_launch_result = launch_result;
    return Py_BuildValue("(KKK)", (unsigned long long)(uintptr_t)&record_launch,
                         (unsigned long long)(uintptr_t)&fake_ctx, (unsigned long long)(uintptr_t)&record_launch_ex);
}

static PyObject *py_last_launch(PyObject *mod, PyObject *unused) {
    PyObject *params = PyTuple_New(g_rec.nparams);
    if (params == NULL)
        return NULL;
    for (int i = 0; i < g_rec.nparams; i++)
        PyTuple_SET_ITEM(params, i, PyLong_FromUnsignedLongLong(g_rec.params[i]));
    return Py_BuildValue("{s:K,s:(III),s:(III),s:I,s:K,s:N,s:l}", "function",
                         (unsigned long long)(uintptr_t)g_rec.function, "grid", g_rec.grid[0], g_rec.grid[1],
                         g_rec.grid[2], "block", g_rec.block[0], g_rec.block[1], g_rec.block[2], "shared",
                         g_rec.shared, "stream", (unsigned long long)(uintptr_t)g_rec.stream, "params", params,
                         "calls", g_rec.calls);
}

static PyMethodDef methods[] = {
    {"test_doubles", py_test_doubles, METH_VARARGS,
     "test_doubles(ctx_present=1, launch_result=0) -> addresses of (record_launch, fake_ctx, record_launch_ex)"},
    {"last_launch", py_last_launch, METH_NOARGS, "What the recording launch function got last."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_swa_claunch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__swa_claunch(void) {
    if (PyType_Ready(&LauncherType) < 0)
        return NULL;
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    if (s_data_ptr == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
