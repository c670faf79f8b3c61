/* Allocations that fail under an address-space limit the program sets
 * itself (each smaller than that limit, so the shim asks for an eviction
 * when it can): NULL with errno = ENOMEM. */
#include <errno.h>
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

int main(void) {
    /* Room for one block of 64 MiB, held, and not for a second one. */
    struct rlimit tight = {vm_size() + ((size_t)96 << 20), RLIM_INFINITY};
    struct rlimit open = {RLIM_INFINITY, RLIM_INFINITY};
    int fails = 0;
    setrlimit(RLIMIT_AS, &tight);
    void *held = alloc((size_t)64 << 20);
    for (int i = 0; i < 3; i++) {
        errno = 0;
        void *p = alloc((size_t)64 << 20);
        if (!p && errno == ENOMEM)
            fails++;
        free(p);
    }
    setrlimit(RLIMIT_AS, &open);
    free(held);
    if (!held || fails != 3) {
        printf("BAD %d\n", fails);
        return 1;
    }
    printf("ENOMEM OK\n");
    return 0;
}
