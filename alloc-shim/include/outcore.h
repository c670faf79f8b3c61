/* outcore.h: the C entry points of the outcore runtime and of its
 * LD_PRELOAD shim (liboutcore_shim.so).
 *
 * A process that runs an outcore runtime exports outcore_evict,
 * outcore_usage and outcore_cap. C code can call them directly, or, as
 * the shim does, look them up at run time:
 *
 *     size_t (*evict)(size_t) = dlsym(RTLD_DEFAULT, "outcore_evict");
 *
 * Declare them weak (see examples/usage.c) to build a program that also
 * runs without a runtime in the process.
 */
#ifndef OUTCORE_H
#define OUTCORE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Evicts idle executors of the outcore runtimes in this process until at
 * least `bytes` are freed or nothing is left to evict. Returns the bytes
 * freed: 0 when there is no runtime or nothing can be evicted, 1 when
 * another thread's eviction ran meanwhile (retry your allocation). Safe to
 * call from any thread, including from inside an allocator: it never
 * calls malloc on its own account. */
size_t outcore_evict(size_t bytes);

/* Bytes the runtime accounts as in use by the process's Rust allocations
 * (executors included). */
size_t outcore_usage(void);

/* The runtime's soft memory cap in bytes, or 0 when there is none. */
size_t outcore_cap(void);

/* Provided by liboutcore_shim.so. A runtime registers its eviction entry
 * point here when it starts (used when the executable does not export
 * outcore_evict dynamically). NULL withdraws it, and makes the shim look
 * outcore_evict up again by name: call it before unloading (dlclose) a
 * library the registered function lives in, while no other thread
 * allocates (an allocation failing at that moment may still be calling
 * it). The runtime withdraws its own when its last instance is dropped. */
void outcore_shim_register(size_t (*evict)(size_t bytes));

/* Provided by liboutcore_shim.so. A runtime registers its usage query here
 * too, so that OUTCORE_MEM_CAP budgets C and Rust allocations together.
 * NULL withdraws it, as above. */
void outcore_shim_register_usage(size_t (*usage)(void));

/* Provided by liboutcore_shim.so: usable bytes of live C allocations, as
 * counted when OUTCORE_MEM_CAP is set (0 otherwise). */
size_t outcore_shim_usage(void);

#ifdef __cplusplus
}
#endif

#endif /* OUTCORE_H */
