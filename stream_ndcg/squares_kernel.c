/* The compiled core's kernel of `list_squares`: a group's lists scored and rescored, and the
 * squares of their DCGs summed, on doubles and machine words rather than Python objects.
 *
 * `list_squares.py` is the reference: each function here does what the Python loop it stands
 * for does (named below), on the same containers, and gives the same numbers to the last bit
 * (tests/unit/test_squares_kernel.py drives both with the same operations). Only the compiled
 * core loads it (`core_build`); the pure core runs the Python loops.
 *
 * - A list's DCG at a cut-off is the correctly rounded sum of its nonzero terms (gain times
 *   discount), as `math.fsum` gives it: Shewchuk's partials, rounded as CPython's fsum rounds them.
 * - The sum of squares at a cut-off is exact, a whole number of 2**-1074 (`window_sums.exact`):
 *   each square (the double `value * value`) times its list's impressions is added into a
 *   fixed-point accumulator of 64-bit limbs, two's complement, and the accumulator is added to
 *   the Python integer the group keeps once per call, where the Python loops add each square
 *   to it, an allocation each.
 *
 * The ranks of a list's nonzero terms are kept as a mask (bit r: rank r + 1) in a machine word:
 * `list_squares` calls the kernel only where the deepest cut-off is at most `MAX_DEPTH`.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
/* 2**-1074 to 2**1024 is 2,098 bits; times an impression count below 2**64, and room for the
 * sum of that many: 40 limbs of 64 bits. */
#define LIMBS 40
/* The most cut-offs the kernel's accumulators are kept on the stack for. */
#define MAX_CUTOFFS 64

static PyObject *python_fsum;

typedef struct {
    uint64_t limb[LIMBS];
    int touched;
} Accumulator;

/* `count` times the exact value of the double `square` (not negative) added to the accumulator,
 * or taken from it when `negative`; -1 with OverflowError where the square is not finite, as
 * `window_sums.exact` raises. */
static int
accumulate(Accumulator *acc, double square, uint64_t count, int negative)
{
    if (square == 0.0 || count == 0) {
        return 0;
    }
    if (!isfinite(square)) {
        PyErr_SetString(PyExc_OverflowError, "squares_kernel: a DCG's square is not finite");
        return -1;
    }
    int exponent;
    double mantissa = frexp(square, &exponent);
    int shift = exponent + 1074 - 53;
    uint64_t significand = (uint64_t)(mantissa * 9007199254740992.0); /* 2**53: exact */
    if (shift < 0) {
        /* A subnormal: its significand ends in at least as many zero bits as are dropped. */
        significand >>= -shift;
        shift = 0;
    }
    /* significand * count as two words, from 32-bit halves (C has no wider type everywhere). */
    uint64_t s0 = significand & 0xffffffffu, s1 = significand >> 32, c0 = count & 0xffffffffu, c1 = count >> 32;
    uint64_t p00 = s0 * c0, p01 = s0 * c1, p10 = s1 * c0;
    uint64_t middle = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    uint64_t low = (middle << 32) | (p00 & 0xffffffffu);
    uint64_t high = s1 * c1 + (p01 >> 32) + (p10 >> 32) + (middle >> 32);
    int at = shift / 64, bit = shift % 64;
    uint64_t words[3];
    words[0] = low << bit;
    words[1] = bit ? (high << bit) | (low >> (64 - bit)) : high;
    words[2] = bit ? high >> (64 - bit) : 0;
    int i = at;
    if (!negative) {
        uint64_t carry = 0;
        for (; i < at + 3; i++) {
            uint64_t sum = acc->limb[i] + words[i - at];
            uint64_t carried = sum < words[i - at];
            sum += carry;
            carry = carried | (sum < carry);
            acc->limb[i] = sum;
        }
        for (; carry && i < LIMBS; i++) {
            carry = ++acc->limb[i] == 0;
        }
    }
    else {
        uint64_t borrow = 0;
        for (; i < at + 3; i++) {
            uint64_t before = acc->limb[i];
            uint64_t difference = before - words[i - at];
            uint64_t borrowed = before < words[i - at];
            borrowed |= difference < borrow;
            acc->limb[i] = difference - borrow;
            borrow = borrowed;
        }
        for (; borrow && i < LIMBS; i++) {
            borrow = acc->limb[i]-- == 0;
        }
    }
    acc->touched = 1;
    return 0;
}

/* The accumulator's value added to the Python integer `*total` (a new reference replaces it);
 * -1 on an error. Only the limbs that hold the value are read: the rest are zero below it and
 * its sign above it. */
static int
add_to_total(const Accumulator *acc, PyObject **total)
{
    if (!acc->touched) {
        return 0;
    }
    uint64_t sign = acc->limb[LIMBS - 1] >> 63 ? UINT64_MAX : 0;
    int high = LIMBS - 1;
    while (high > 0 && acc->limb[high] == sign && (acc->limb[high - 1] >> 63) == (sign & 1)) {
        high--;
    }
    int low = 0;
    while (low < high && acc->limb[low] == 0) {
        low++;
    }
    if (high == 0 && acc->limb[0] == 0) {
        return 0;
    }
    unsigned char bytes[LIMBS * 8];
    size_t size = 0;
    for (int i = low; i <= high; i++) {
        for (int b = 0; b < 64; b += 8) {
            bytes[size++] = (unsigned char)(acc->limb[i] >> b);
        }
    }
    PyObject *value = _PyLong_FromByteArray(bytes, size, 1, 1);
    if (value == NULL) {
        return -1;
    }
    if (low > 0) {
        PyObject *places = PyLong_FromLong(64L * low);
        if (places == NULL) {
            Py_DECREF(value);
            return -1;
        }
        PyObject *shifted = PyNumber_Lshift(value, places);
        Py_DECREF(places);
        Py_DECREF(value);
        if (shifted == NULL) {
            return -1;
        }
        value = shifted;
    }
    PyObject *sum = PyNumber_Add(*total, value);
    Py_DECREF(value);
    if (sum == NULL) {
        return -1;
    }
    Py_SETREF(*total, sum);
    return 0;
}

/* The first `count` terms' correctly rounded sum (`math.fsum`): Shewchuk's partials, and
 * CPython's rounding of them, half to even across partials. -1 where a partial is not finite
 * (then the caller asks `math.fsum` itself). */
static int
exact_sum(const double *terms, int count, double *result)
{
    double partials[MAX_DEPTH + 1];
    int n = 0;
    for (int t = 0; t < count; t++) {
        double x = terms[t];
        int i = 0;
        for (int j = 0; j < n; j++) {
            double y = partials[j];
            if (fabs(x) < fabs(y)) {
                double swap = x;
                x = y;
                y = swap;
            }
            double hi = x + y;
            double lo = y - (hi - x);
            if (lo != 0.0) {
                partials[i++] = lo;
            }
            x = hi;
        }
        n = i;
        if (x != 0.0) {
            if (!isfinite(x)) {
                return -1;
            }
            partials[n++] = x;
        }
    }
    double hi = 0.0;
    if (n > 0) {
        double lo = 0.0;
        hi = partials[--n];
        while (n > 0) {
            double x = hi;
            double y = partials[--n];
            hi = x + y;
            lo = y - (hi - x);
            if (lo != 0.0) {
                break;
            }
        }
        if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
            double y = lo * 2.0;
            double x = hi + y;
            if (y == x - hi) {
                hi = x;
            }
        }
    }
    *result = hi;
    return 0;
}

/* `math.fsum` of the first `count` terms; -1 on an error. */
static int
python_exact_sum(const double *terms, int count, double *result)
{
    PyObject *list = PyList_New(count);
    if (list == NULL) {
        return -1;
    }
    for (int i = 0; i < count; i++) {
        PyObject *term = PyFloat_FromDouble(terms[i]);
        if (term == NULL) {
            Py_DECREF(list);
            return -1;
        }
        PyList_SET_ITEM(list, i, term);
    }
    PyObject *sum = PyObject_CallOneArg(python_fsum, list);
    Py_DECREF(list);
    if (sum == NULL) {
        return -1;
    }
    *result = PyFloat_AsDouble(sum);
    Py_DECREF(sum);
    return *result == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* What a call knows of one document: the gain the query's dict gives it (or none) and whether it
 * is in the moved set, each found at its first ask. A call's lists mostly show a few documents
 * over and over, as the same string objects (the engine interns them; a group read back shares
 * one copy per query), so a look-up by the object's address spares most of the dict's and the
 * set's. Equal strings at two addresses are two entries, each with the same answers. */
typedef struct {
    PyObject *doc;
    double gain;
    signed char judged; /* -1: not asked yet */
    signed char moved;  /* -1: not asked yet */
} Known;

/* Slots of a call's table of known documents (a power of two), and how many it fills at most:
 * past that, documents are looked up in the dict and the set each time. */
#define KNOWN_SLOTS 1024
#define KNOWN_HELD 512

/* What scoring needs of a call's arguments, read once per call, and what it learns. */
typedef struct {
    PyObject *gains; /* dict: document -> gain */
    PyObject *moved; /* the documents whose grade moved (rescore), or NULL */
    double discounts[MAX_DEPTH];
    int depth;
    int cutoffs[MAX_CUTOFFS];
    int stride;
    /* The table of known documents, empty between calls: the slots a call fills are listed in
     * `used`, and emptied when it ends (`with_scoring`), rather than the whole table at each call. */
    int held;
    unsigned short used[KNOWN_HELD];
    Known known[KNOWN_SLOTS];
} Scoring;

static int
read_scoring(PyObject *gains, PyObject *discounts, PyObject *cutoffs, PyObject *moved, Scoring *scoring)
{
    if (!PyDict_Check(gains) || !PyTuple_Check(discounts) || !PyTuple_Check(cutoffs)) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: gains must be a dict, discounts and cutoffs tuples");
        return -1;
    }
    Py_ssize_t depth = PyTuple_GET_SIZE(discounts), stride = PyTuple_GET_SIZE(cutoffs);
    if (depth > MAX_DEPTH || stride > MAX_CUTOFFS) {
        PyErr_SetString(PyExc_ValueError, "squares_kernel: deeper than MAX_DEPTH ranks or more than 64 cut-offs");
        return -1;
    }
    scoring->gains = gains;
    scoring->moved = moved;
    scoring->depth = (int)depth;
    scoring->stride = (int)stride;
    for (Py_ssize_t i = 0; i < depth; i++) {
        scoring->discounts[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(discounts, i));
        if (scoring->discounts[i] == -1.0 && PyErr_Occurred()) {
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < stride; i++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(cutoffs, i));
        if (k == -1 && PyErr_Occurred()) {
            return -1;
        }
        scoring->cutoffs[i] = k > INT32_MAX ? INT32_MAX : (int)k;
    }
    return 0;
}

/* The entry of `doc` in the call's table, made if new; NULL once the table holds its most. */
static Known *
known_of(Scoring *scoring, PyObject *doc)
{
    size_t slot = (size_t)((((uintptr_t)doc >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 54) & (KNOWN_SLOTS - 1);
    for (;;) {
        Known *known = &scoring->known[slot];
        if (known->doc == doc) {
            return known;
        }
        if (known->doc == NULL) {
            if (scoring->held >= KNOWN_HELD) {
                return NULL;
            }
            scoring->used[scoring->held++] = (unsigned short)slot;
            known->doc = doc;
            known->judged = known->moved = -1;
            return known;
        }
        slot = (slot + 1) & (KNOWN_SLOTS - 1);
    }
}

/* Whether `doc` (not None) is in the moved set; -1 on an error. */
static int
is_moved(Scoring *scoring, PyObject *doc)
{
    Known *known = known_of(scoring, doc);
    if (known != NULL && known->moved >= 0) {
        return known->moved;
    }
    PyObject *moved = scoring->moved;
    int found = PyAnySet_Check(moved) ? PySet_Contains(moved, doc) : PySequence_Contains(moved, doc);
    if (found >= 0 && known != NULL) {
        known->moved = (signed char)found;
    }
    return found;
}

/* The gain of `doc` times the discount of `rank` in `*term`: 0 where `doc` is None or unjudged.
 * -1 on an error. (`list_squares._nonzero_terms`' look-up.) */
static int
term_of(Scoring *scoring, PyObject *doc, int rank, double *term)
{
    *term = 0.0;
    if (doc == Py_None) {
        return 0;
    }
    /* Once the call's table is full, a document is known for this look-up alone. */
    Known once = {doc, 0.0, -1, -1};
    Known *known = known_of(scoring, doc);
    if (known == NULL) {
        known = &once;
    }
    if (known->judged < 0) {
        PyObject *gain = PyDict_GetItemWithError(scoring->gains, doc);
        if (gain == NULL && PyErr_Occurred()) {
            return -1;
        }
        known->judged = gain != NULL;
        if (gain != NULL) {
            known->gain = PyFloat_CheckExact(gain) ? PyFloat_AS_DOUBLE(gain) : PyFloat_AsDouble(gain);
            if (known->gain == -1.0 && PyErr_Occurred()) {
                known->judged = -1;
                return -1;
            }
        }
    }
    if (known->judged) {
        *term = known->gain * scoring->discounts[rank];
    }
    return 0;
}

/* A list's nonzero terms at the ranks `mask` sets, and their ranks (`_nonzero_terms`); how many,
 * -1 on an error. */
static int
nonzero_terms(Scoring *scoring, PyObject *top, uint64_t mask, double *terms, int *ranks)
{
    Py_ssize_t length = PyTuple_GET_SIZE(top);
    int judged = 0;
    for (int rank = 0; mask != 0 && rank < length; rank++, mask >>= 1) {
        if (!(mask & 1)) {
            continue;
        }
        double term;
        if (term_of(scoring, PyTuple_GET_ITEM(top, rank), rank, &term) < 0) {
            return -1;
        }
        if (term != 0.0) {
            terms[judged] = term;
            ranks[judged] = rank;
            judged++;
        }
    }
    return judged;
}

/* A list's DCG at each cut-off into `found`, from its nonzero terms (`_dcgs`); -1 on an error. */
static int
dcgs_of(const Scoring *scoring, const double *terms, const int *ranks, int judged, double *found)
{
    int last = -1;
    double value = 0.0;
    for (int cut = 0; cut < scoring->stride; cut++) {
        int k = scoring->cutoffs[cut];
        int within = 0;
        while (within < judged && ranks[within] < k) {
            within++;
        }
        if (within != last) {
            last = within;
            if (within == 0) {
                value = 0.0;
            }
            else if (within == 1) {
                value = terms[0];
            }
            else if (within == 2) {
                value = terms[0] + terms[1];
            }
            else if (exact_sum(terms, within, &value) < 0 && python_exact_sum(terms, within, &value) < 0) {
                return -1;
            }
        }
        found[cut] = value;
    }
    return 0;
}

static int
count_of(PyObject *counts, Py_ssize_t number, uint64_t *count)
{
    if (number >= PyList_GET_SIZE(counts)) {
        PyErr_SetString(PyExc_IndexError, "squares_kernel: a list without its count");
        return -1;
    }
    unsigned long long value = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(counts, number));
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *count = value;
    return 0;
}

/* Whether a function was given other than its `expected` number of arguments (then TypeError). */
static int
wrong_count(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected, nargs);
    return 1;
}

static int
check_lists(PyObject *tops, PyObject *masks, PyObject *counts, PyObject *totals, int stride)
{
    if (!PyList_Check(tops) || !PyList_Check(masks) || !PyList_Check(counts)) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: tops, masks and counts must be lists");
        return -1;
    }
    if (!PyList_Check(totals) || PyList_GET_SIZE(totals) != stride) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: totals must be a list of one integer per cut-off");
        return -1;
    }
    return 0;
}

/* The lists' DCGs, an `array("d")`, as doubles in place (writable for a rescoring): its length
 * cannot change until the view is released. -1 on an error. */
static int
dcgs_view(PyObject *dcgs, Py_buffer *view, int writable)
{
    if (PyObject_GetBuffer(dcgs, view, PyBUF_FORMAT | PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != sizeof(double) || view->format == NULL || strcmp(view->format, "d") != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "squares_kernel: dcgs must be an array of doubles");
        return -1;
    }
    return 0;
}

/* Each accumulator added to its cut-off's total; -1 on an error. */
static int
finish(const Accumulator *accumulators, int stride, PyObject *totals)
{
    if (PyList_GET_SIZE(totals) != stride) {
        PyErr_SetString(PyExc_RuntimeError, "squares_kernel: totals changed size during the call");
        return -1;
    }
    for (int cut = 0; cut < stride; cut++) {
        /* The list's reference to the old total moves to the new one. */
        PyObject **slot = &((PyListObject *)totals)->ob_item[cut];
        if (add_to_total(&accumulators[cut], slot) < 0) {
            return -1;
        }
    }
    return 0;
}

static int score_into(Scoring *scoring, PyObject *tops, Py_ssize_t first, Py_ssize_t new_lists, PyObject *counts,
                      double *found_all, uint64_t *masks_all, Accumulator *accumulators);

/* The lists of `tops` from `first` on scored (score_new's arguments, `scoring` made here). The new
 * lists' DCGs and masks are appended once all are scored, and the totals moved last, so that a
 * failure leaves the totals as they were. */
static PyObject *
score_lists(Scoring *scoring, PyObject *const *args)
{
    PyObject *tops = args[0], *masks = args[5], *dcgs = args[6], *counts = args[7], *totals = args[8];
    Py_ssize_t first = PyLong_AsSsize_t(args[1]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (read_scoring(args[2], args[3], args[4], NULL, scoring) < 0
            || check_lists(tops, masks, counts, totals, scoring->stride) < 0) {
        return NULL;
    }
    if (first < 0 || first > PyList_GET_SIZE(tops)) {
        PyErr_SetString(PyExc_IndexError, "squares_kernel: first is not a list's number");
        return NULL;
    }
    Py_ssize_t new_lists = PyList_GET_SIZE(tops) - first;
    double *found_all = PyMem_Malloc(sizeof(double) * (size_t)(new_lists * scoring->stride + 1));
    uint64_t *masks_all = PyMem_Malloc(sizeof(uint64_t) * (size_t)(new_lists + 1));
    Accumulator accumulators[MAX_CUTOFFS];
    memset(accumulators, 0, sizeof(Accumulator) * (size_t)scoring->stride);
    int changed = -1;
    if (found_all == NULL || masks_all == NULL) {
        PyErr_NoMemory();
    }
    else {
        changed = score_into(scoring, tops, first, new_lists, counts, found_all, masks_all, accumulators);
    }
    if (changed >= 0) {
        PyObject *packed = PyBytes_FromStringAndSize((const char *)found_all,
                                                     (Py_ssize_t)sizeof(double) * new_lists * scoring->stride);
        PyObject *done = packed == NULL ? NULL : PyObject_CallMethod(dcgs, "frombytes", "O", packed);
        Py_XDECREF(packed);
        changed = done == NULL ? -1 : changed;
        Py_XDECREF(done);
    }
    for (Py_ssize_t i = 0; changed >= 0 && i < new_lists; i++) {
        PyObject *mask = PyLong_FromUnsignedLongLong(masks_all[i]);
        if (mask == NULL || PyList_Append(masks, mask) < 0) {
            changed = -1;
        }
        Py_XDECREF(mask);
    }
    PyMem_Free(found_all);
    PyMem_Free(masks_all);
    if (changed < 0 || finish(accumulators, scoring->stride, totals) < 0) {
        return NULL;
    }
    return PyBool_FromLong(changed);
}

/* The body of score_lists: each new list's DCGs into `found_all` (by list, then cut-off), its mask
 * into `masks_all`, its squares into the accumulators. Whether a sum moved, or -1 on an error. */
static int
score_into(Scoring *scoring, PyObject *tops, Py_ssize_t first, Py_ssize_t new_lists, PyObject *counts,
           double *found_all, uint64_t *masks_all, Accumulator *accumulators)
{
    double terms[MAX_DEPTH];
    int ranks[MAX_DEPTH];
    int changed = 0;
    for (Py_ssize_t i = 0; i < new_lists; i++) {
        Py_ssize_t number = first + i;
        if (number >= PyList_GET_SIZE(tops)) {
            PyErr_SetString(PyExc_RuntimeError, "squares_kernel: tops changed size during the call");
            return -1;
        }
        PyObject *top = PyList_GET_ITEM(tops, number);
        double *found = found_all + i * scoring->stride;
        if (!PyTuple_Check(top)) {
            PyErr_SetString(PyExc_TypeError, "squares_kernel: a list must be a tuple");
            return -1;
        }
        Py_ssize_t length = PyTuple_GET_SIZE(top);
        int shown = length < scoring->depth ? (int)length : scoring->depth;
        uint64_t every = shown == 64 ? UINT64_MAX : (((uint64_t)1 << shown) - 1);
        int judged = nonzero_terms(scoring, top, every, terms, ranks);
        if (judged < 0) {
            return -1;
        }
        uint64_t mask = 0;
        for (int j = 0; j < judged; j++) {
            mask |= (uint64_t)1 << ranks[j];
        }
        masks_all[i] = mask;
        uint64_t count;
        if (dcgs_of(scoring, terms, ranks, judged, found) < 0 || count_of(counts, number, &count) < 0) {
            return -1;
        }
        for (int cut = 0; cut < scoring->stride; cut++) {
            if (found[cut] != 0.0) {
                if (accumulate(&accumulators[cut], found[cut] * found[cut], count, 0) < 0) {
                    return -1;
                }
                changed = 1;
            }
        }
    }
    return changed;
}

/* One list rescored after the moved documents' grades moved (rescore_lists' body, per list). With
 * `only_if_shown`, a list that shows none of them is left as it is. 0, or -1 on an error. */
static int
rescore_one(Scoring *scoring, Py_ssize_t number, PyObject *tops, PyObject *masks, Py_buffer *dcgs, PyObject *counts,
            Accumulator *accumulators, int only_if_shown, int *changed)
{
    double terms[MAX_DEPTH], found[MAX_CUTOFFS];
    int ranks[MAX_DEPTH];
    if (number < 0 || number >= PyList_GET_SIZE(tops) || number >= PyList_GET_SIZE(masks)
            || (Py_ssize_t)sizeof(double) * (number + 1) * scoring->stride > dcgs->len) {
        PyErr_SetString(PyExc_IndexError, "squares_kernel: a list number out of range");
        return -1;
    }
    PyObject *top = PyList_GET_ITEM(tops, number);
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) > scoring->depth) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: a list must be a tuple within the depth");
        return -1;
    }
    unsigned long long held = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(masks, number));
    if (held == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    uint64_t mask = held;
    int shown = 0;
    for (Py_ssize_t rank = 0; rank < PyTuple_GET_SIZE(top); rank++) {
        PyObject *doc = PyTuple_GET_ITEM(top, rank);
        if (doc == Py_None) {
            continue;
        }
        int moved = is_moved(scoring, doc);
        if (moved < 0) {
            return -1;
        }
        if (!moved) {
            continue;
        }
        shown = 1;
        double term;
        if (term_of(scoring, doc, (int)rank, &term) < 0) {
            return -1;
        }
        if (term != 0.0) {
            mask |= (uint64_t)1 << rank;
        }
        else {
            mask &= ~((uint64_t)1 << rank);
        }
    }
    if (only_if_shown && !shown) {
        return 0;
    }
    if (mask != held) {
        PyObject *mask_object = PyLong_FromUnsignedLongLong(mask);
        if (mask_object == NULL || PyList_SetItem(masks, number, mask_object) < 0) {
            return -1;
        }
    }
    int judged = nonzero_terms(scoring, top, mask, terms, ranks);
    uint64_t count;
    if (judged < 0 || dcgs_of(scoring, terms, ranks, judged, found) < 0 || count_of(counts, number, &count) < 0) {
        return -1;
    }
    double *held_dcgs = (double *)dcgs->buf + number * scoring->stride;
    for (int cut = 0; cut < scoring->stride; cut++) {
        double old = held_dcgs[cut], new = found[cut];
        if (old != new) {
            held_dcgs[cut] = new;
            *changed = 1;
            if (accumulate(&accumulators[cut], new * new, count, 0) < 0
                    || accumulate(&accumulators[cut], old * old, count, 1) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *rescore_viewed(Scoring *scoring, PyObject *showing, PyObject *tops, PyObject *masks,
                               Py_buffer *dcgs, PyObject *counts, PyObject *moved, PyObject *totals);

/* The lists that show a moved document rescored (rescore's arguments, `scoring` made here): found
 * through the index where the group has one (`_showing`), each once, else by walking them all. */
static PyObject *
rescore_lists(Scoring *scoring, PyObject *const *args)
{
    PyObject *showing = args[0], *tops = args[1], *masks = args[2], *dcgs = args[3], *counts = args[4];
    PyObject *moved = args[5], *totals = args[9];
    if (read_scoring(args[6], args[7], args[8], moved, scoring) < 0
            || check_lists(tops, masks, counts, totals, scoring->stride) < 0) {
        return NULL;
    }
    if (showing != Py_None && !PyDict_Check(showing)) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: showing must be a dict or None");
        return NULL;
    }
    Py_buffer view;
    if (dcgs_view(dcgs, &view, 1) < 0) {
        return NULL;
    }
    PyObject *result = rescore_viewed(scoring, showing, tops, masks, &view, counts, moved, totals);
    PyBuffer_Release(&view);
    return result;
}

/* The body of rescore_lists, with the lists' DCGs in view. */
static PyObject *
rescore_viewed(Scoring *scoring, PyObject *showing, PyObject *tops, PyObject *masks, Py_buffer *dcgs,
               PyObject *counts, PyObject *moved, PyObject *totals)
{
    Accumulator accumulators[MAX_CUTOFFS];
    memset(accumulators, 0, sizeof(Accumulator) * (size_t)scoring->stride);
    int changed = 0;
    if (showing == Py_None) {
        for (Py_ssize_t number = 0; number < PyList_GET_SIZE(tops); number++) {
            if (rescore_one(scoring, number, tops, masks, dcgs, counts, accumulators, 1, &changed) < 0) {
                return NULL;
            }
        }
    }
    else {
        Py_ssize_t lists = PyList_GET_SIZE(tops);
        unsigned char *seen = PyMem_Calloc((size_t)lists / 8 + 1, 1);
        PyObject *iterator = seen == NULL ? NULL : PyObject_GetIter(moved);
        if (iterator == NULL) {
            PyMem_Free(seen);
            return seen == NULL ? PyErr_NoMemory() : NULL;
        }
        PyObject *doc;
        int failed = 0;
        while (!failed && (doc = PyIter_Next(iterator)) != NULL) {
            PyObject *numbers = PyDict_GetItemWithError(showing, doc);
            Py_DECREF(doc);
            if (numbers == NULL) {
                failed = PyErr_Occurred() != NULL;
                continue;
            }
            if (!PyList_Check(numbers)) {
                PyErr_SetString(PyExc_TypeError, "squares_kernel: the index must hold lists of numbers");
                failed = 1;
                continue;
            }
            for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(numbers); i++) {
                Py_ssize_t number = PyLong_AsSsize_t(PyList_GET_ITEM(numbers, i));
                if (number < 0 || number >= lists) {
                    if (!PyErr_Occurred()) {
                        PyErr_SetString(PyExc_IndexError, "squares_kernel: a list number out of range");
                    }
                    failed = 1;
                }
                else if (!(seen[number / 8] & (1 << (number % 8)))) {
                    seen[number / 8] |= (unsigned char)(1 << (number % 8));
                    failed = rescore_one(scoring, number, tops, masks, dcgs, counts, accumulators, 0, &changed) < 0;
                }
            }
        }
        Py_DECREF(iterator);
        PyMem_Free(seen);
        if (failed || PyErr_Occurred()) {
            return NULL;
        }
    }
    if (finish(accumulators, scoring->stride, totals) < 0) {
        return NULL;
    }
    return PyBool_FromLong(changed);
}

/* `top`'s documents added to the index of the lists that show each (`list_squares._index`): its
 * number is one object, in the list of each document it shows. */
static int
index_one(PyObject *showing, PyObject *top, PyObject *number_object)
{
    for (Py_ssize_t rank = 0; rank < PyTuple_GET_SIZE(top); rank++) {
        PyObject *doc = PyTuple_GET_ITEM(top, rank);
        if (doc == Py_None) {
            continue;
        }
        PyObject *numbers = PyDict_GetItemWithError(showing, doc);
        int failed;
        if (numbers == NULL) {
            PyObject *list = PyErr_Occurred() ? NULL : PyList_New(1);
            if (list != NULL) {
                Py_INCREF(number_object);
                PyList_SET_ITEM(list, 0, number_object);
            }
            failed = list == NULL || PyDict_SetItem(showing, doc, list) < 0;
            Py_XDECREF(list);
        }
        else {
            failed = !PyList_Check(numbers) || PyList_Append(numbers, number_object) < 0;
            if (failed && !PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "squares_kernel: the index must hold lists of numbers");
            }
        }
        if (failed) {
            return -1;
        }
    }
    return 0;
}

/* The ranks a list's DCGs read (`list_squares._top`): `ranked` cut to `depth`, a document repeated
 * None at its later ranks; `ranked` itself where that is all of it. A new reference. */
static PyObject *
first_shown(PyObject *ranked, Py_ssize_t depth)
{
    Py_ssize_t length = PyTuple_GET_SIZE(ranked) < depth ? PyTuple_GET_SIZE(ranked) : depth;
    Py_hash_t hashes[MAX_DEPTH];
    unsigned char repeated[MAX_DEPTH];
    int repeats = 0;
    for (Py_ssize_t rank = 0; rank < length; rank++) {
        PyObject *doc = PyTuple_GET_ITEM(ranked, rank);
        hashes[rank] = PyObject_Hash(doc);
        if (hashes[rank] == -1 && PyErr_Occurred()) {
            return NULL;
        }
        repeated[rank] = 0;
        for (Py_ssize_t before = 0; before < rank && !repeated[rank]; before++) {
            PyObject *other = PyTuple_GET_ITEM(ranked, before);
            if (other == doc) {
                repeated[rank] = 1;
            }
            else if (hashes[before] == hashes[rank]) {
                int equal = PyObject_RichCompareBool(other, doc, Py_EQ);
                if (equal < 0) {
                    return NULL;
                }
                repeated[rank] = (unsigned char)equal;
            }
        }
        repeats += repeated[rank];
    }
    if (!repeats) {
        if (length == PyTuple_GET_SIZE(ranked)) {
            Py_INCREF(ranked);
            return ranked;
        }
        return PyTuple_GetSlice(ranked, 0, length);
    }
    PyObject *top = PyTuple_New(length);
    if (top == NULL) {
        return NULL;
    }
    for (Py_ssize_t rank = 0; rank < length; rank++) {
        PyObject *doc = repeated[rank] ? Py_None : PyTuple_GET_ITEM(ranked, rank);
        Py_INCREF(doc);
        PyTuple_SET_ITEM(top, rank, doc);
    }
    return top;
}

PyDoc_STRVAR(index_lists_doc,
"index_lists(showing, tops) -> None\n\n"
"The lists of `tops` added to `showing`, the index of the lists (by number) that show each\n"
"document. `list_squares._index`, over a group's lists.");

static PyObject *
index_lists(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_count("index_lists", nargs, 2)) {
        return NULL;
    }
    PyObject *showing = args[0], *tops = args[1];
    if (!PyDict_Check(showing) || !PyList_Check(tops)) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: showing must be a dict and tops a list");
        return NULL;
    }
    for (Py_ssize_t number = 0; number < PyList_GET_SIZE(tops); number++) {
        PyObject *top = PyList_GET_ITEM(tops, number);
        if (!PyTuple_Check(top)) {
            PyErr_SetString(PyExc_TypeError, "squares_kernel: a list must be a tuple");
            return NULL;
        }
        PyObject *number_object = PyLong_FromSsize_t(number);
        int failed = number_object == NULL || index_one(showing, top, number_object) < 0;
        Py_XDECREF(number_object);
        if (failed) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *take_viewed(PyObject *numbers, PyObject *tops, PyObject *counts, PyObject *showing,
                             PyObject *pending, PyObject *pending_counts, PyObject *pending_plain, Py_buffer *dcgs,
                             Py_ssize_t depth, int stride, PyObject *totals);

PyDoc_STRVAR(take_pending_doc,
"take_pending(numbers, tops, counts, showing, pending, pending_counts, pending_plain, dcgs, depth, totals)\n"
"-> bool\n\n"
"The lists taken since the last sums: a list new to the group numbered (`numbers`), its ranks\n"
"(`_top`, unless `pending_plain` says it repeats nothing within `depth`) appended to `tops`, its\n"
"impressions to `counts`, and indexed in `showing` (unless None); a list the group held has its\n"
"impressions counted, and those of a list scored before the call add its DCGs' squares to `totals`.\n"
"Whether a sum moved. The loop of `list_squares.ListSquares._take_pending`; the new lists are\n"
"scored by `score_new`.");

static PyObject *
take_pending(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_count("take_pending", nargs, 10)) {
        return NULL;
    }
    PyObject *numbers = args[0], *tops = args[1], *counts = args[2], *showing = args[3];
    PyObject *pending = args[4], *pending_counts = args[5], *pending_plain = args[6], *dcgs = args[7];
    PyObject *totals = args[9];
    Py_ssize_t depth = PyLong_AsSsize_t(args[8]);
    if (depth == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyDict_Check(numbers) || !PyList_Check(tops) || !PyList_Check(counts) || !PyList_Check(pending)
            || !PyList_Check(pending_counts) || !PyList_Check(pending_plain)
            || !PyList_Check(totals) || (showing != Py_None && !PyDict_Check(showing))) {
        PyErr_SetString(PyExc_TypeError, "squares_kernel: take_pending's containers are dicts and lists");
        return NULL;
    }
    int stride = (int)PyList_GET_SIZE(totals);
    if (depth < 1 || depth > MAX_DEPTH || stride > MAX_CUTOFFS
            || PyList_GET_SIZE(pending_counts) != PyList_GET_SIZE(pending)
            || PyList_GET_SIZE(pending_plain) != PyList_GET_SIZE(pending)) {
        PyErr_SetString(PyExc_ValueError, "squares_kernel: take_pending's depth, totals or pending lists do not fit");
        return NULL;
    }
    Py_buffer view;
    if (dcgs_view(dcgs, &view, 0) < 0) {
        return NULL;
    }
    PyObject *result = take_viewed(numbers, tops, counts, showing, pending, pending_counts, pending_plain, &view,
                                   depth, stride, totals);
    PyBuffer_Release(&view);
    return result;
}

/* The body of take_pending, with the lists' DCGs in view. */
static PyObject *
take_viewed(PyObject *numbers, PyObject *tops, PyObject *counts, PyObject *showing, PyObject *pending,
            PyObject *pending_counts, PyObject *pending_plain, Py_buffer *dcgs, Py_ssize_t depth, int stride,
            PyObject *totals)
{
    Accumulator accumulators[MAX_CUTOFFS];
    memset(accumulators, 0, sizeof(Accumulator) * (size_t)stride);
    Py_ssize_t first_new = PyList_GET_SIZE(tops);
    int changed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *ranked = PyList_GET_ITEM(pending, i), *count_object = PyList_GET_ITEM(pending_counts, i);
        if (!PyTuple_Check(ranked)) {
            PyErr_SetString(PyExc_TypeError, "squares_kernel: a list must be a tuple");
            return NULL;
        }
        PyObject *held_object = PyDict_GetItemWithError(numbers, ranked);
        if (held_object == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            PyObject *number = PyLong_FromSsize_t(PyList_GET_SIZE(tops));
            if (number == NULL) {
                return NULL;
            }
            PyObject *top = NULL;
            if (PyDict_SetItem(numbers, ranked, number) < 0) {
                Py_DECREF(number);
                return NULL;
            }
            if (PyList_GET_ITEM(pending_plain, i) != Py_True || PyTuple_GET_SIZE(ranked) > depth) {
                top = first_shown(ranked, depth);
            }
            else {
                Py_INCREF(ranked);
                top = ranked;
            }
            /* The index holds the number the dict holds, as `_take_pending` indexes it. */
            int failed = top == NULL || (showing != Py_None && index_one(showing, top, number) < 0)
                         || PyList_Append(tops, top) < 0 || PyList_Append(counts, count_object) < 0;
            Py_XDECREF(top);
            Py_DECREF(number);
            if (failed) {
                return NULL;
            }
            continue;
        }
        Py_ssize_t held = PyLong_AsSsize_t(held_object);
        if (held == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (held < 0 || held >= PyList_GET_SIZE(counts)) {
            PyErr_SetString(PyExc_IndexError, "squares_kernel: a list number out of range");
            return NULL;
        }
        PyObject *sum = PyNumber_Add(PyList_GET_ITEM(counts, held), count_object);
        if (sum == NULL || PyList_SetItem(counts, held, sum) < 0) {
            return NULL;
        }
        if (held < first_new) {
            unsigned long long count = PyLong_AsUnsignedLongLong(count_object);
            if (count == (unsigned long long)-1 && PyErr_Occurred()) {
                return NULL;
            }
            if ((Py_ssize_t)sizeof(double) * (held + 1) * stride > dcgs->len) {
                PyErr_SetString(PyExc_IndexError, "squares_kernel: a list without its DCGs");
                return NULL;
            }
            const double *held_dcgs = (const double *)dcgs->buf + held * stride;
            for (int cut = 0; cut < stride; cut++) {
                double value = held_dcgs[cut];
                if (value != 0.0) {
                    if (accumulate(&accumulators[cut], value * value, count, 0) < 0) {
                        return NULL;
                    }
                    changed = 1;
                }
            }
        }
    }
    if (finish(accumulators, stride, totals) < 0) {
        return NULL;
    }
    return PyBool_FromLong(changed);
}

/* The `Scoring` of the call running (some 25 KiB, its table of known documents): one kept for
 * every call, under the GIL, which none of them releases; a call made while it is in use (a
 * container of the arguments' that runs Python code) has one of its own. */
static Scoring shared_scoring;
static int shared_scoring_busy;

static PyObject *
with_scoring(PyObject *(*body)(Scoring *, PyObject *const *), PyObject *const *args)
{
    int shared = !shared_scoring_busy;
    Scoring *scoring = shared ? &shared_scoring : PyMem_Calloc(1, sizeof(Scoring));
    if (scoring == NULL) {
        return PyErr_NoMemory();
    }
    shared_scoring_busy = 1;
    scoring->held = 0;
    PyObject *result = body(scoring, args);
    for (int i = 0; i < scoring->held; i++) {
        scoring->known[scoring->used[i]].doc = NULL;
    }
    scoring->held = 0;
    if (shared) {
        shared_scoring_busy = 0;
    }
    else {
        PyMem_Free(scoring);
    }
    return result;
}

PyDoc_STRVAR(score_new_doc,
"score_new(tops, first, gains, discounts, cutoffs, masks, dcgs, counts, totals) -> bool\n\n"
"The lists of `tops` from `first` on scored: each one's mask appended to `masks` and its DCGs to\n"
"`dcgs`, and its impressions (`counts`) times each DCG's square added to `totals`; whether a sum\n"
"moved. `list_squares.list_dcgs` and the scoring of `ListSquares._take_pending`.");

static PyObject *
score_new(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_count("score_new", nargs, 9)) {
        return NULL;
    }
    return with_scoring(score_lists, args);
}

PyDoc_STRVAR(rescore_doc,
"rescore(showing, tops, masks, dcgs, counts, moved, gains, discounts, cutoffs, totals) -> bool\n\n"
"The lists that show a document of `moved` (found through `showing`, the index, or by walking\n"
"them all where it is None) rescored with `gains` after those documents changed grade: each\n"
"one's mask set at its moved places, its DCGs read from its mask, and `totals` moved by its\n"
"impressions times each changed DCG's new square less its old; whether a DCG moved.\n"
"`list_squares.ListSquares._rescore` and `_showing`.");

static PyObject *
rescore(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (wrong_count("rescore", nargs, 10)) {
        return NULL;
    }
    return with_scoring(rescore_lists, args);
}

static PyMethodDef methods[] = {
    {"score_new", (PyCFunction)(void (*)(void))score_new, METH_FASTCALL, score_new_doc},
    {"rescore", (PyCFunction)(void (*)(void))rescore, METH_FASTCALL, rescore_doc},
    {"index_lists", (PyCFunction)(void (*)(void))index_lists, METH_FASTCALL, index_lists_doc},
    {"take_pending", (PyCFunction)(void (*)(void))take_pending, METH_FASTCALL, take_pending_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    "stream_ndcg.squares_kernel",
    "The compiled core's kernel of list_squares (squares_kernel.c says what it does).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit_squares_kernel(void)
{
    PyObject *math = PyImport_ImportModule("math");
    if (math == NULL) {
        return NULL;
    }
    python_fsum = PyObject_GetAttrString(math, "fsum");
    Py_DECREF(math);
    if (python_fsum == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_definition);
    if (module != NULL && PyModule_AddIntConstant(module, "MAX_DEPTH", MAX_DEPTH) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
