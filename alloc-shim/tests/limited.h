/* For the C tests that make allocations fail under an address-space
 * limit they set themselves (within the limit, so the shim asks for an
 * eviction when it can). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

/* Through a volatile pointer: the compiler may drop a malloc whose block
 * is only freed. */
static void *(*volatile alloc)(size_t) = malloc;

/* Address space mapped now, in bytes. */
static size_t vm_size(void) {
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return (size_t)pages * 4096;
}

/* Sets RLIMIT_AS so that one more block of 64 MiB fits and a second does
 * not, and returns that first block (held until `unlimit`). */
static void *limit_to_one_block(void) {
    struct rlimit tight = {vm_size() + ((size_t)96 << 20), RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &tight);
    return alloc((size_t)64 << 20);
}

/* Lifts the limit and frees the block `limit_to_one_block` returned. */
static void unlimit(void *held) {
    struct rlimit open = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &open);
    free(held);
}
