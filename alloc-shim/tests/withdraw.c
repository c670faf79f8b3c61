/* A program registers an eviction entry point with the shim, then
 * withdraws it with NULL (as a library holding a runtime must before it
 * is unloaded): the shim must not call it afterwards. */
#include <dlfcn.h>
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

static int calls;

static size_t fake_evict(size_t bytes) {
    (void)bytes;
    calls++;
    return 0;
}

static void fail_once(void) {
    /* Room for one block of 64 MiB, held, and not for a second one. */
    struct rlimit tight = {vm_size() + ((size_t)96 << 20), RLIM_INFINITY};
    struct rlimit open = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &tight);
    void *held = alloc((size_t)64 << 20);
    void *p = alloc((size_t)64 << 20);
    setrlimit(RLIMIT_AS, &open);
    free(p);
    free(held);
}

int main(void) {
    void (*reg)(size_t (*)(size_t)) =
        (void (*)(size_t (*)(size_t)))dlsym(RTLD_DEFAULT, "outcore_shim_register");
    if (!reg) {
        printf("NO SHIM\n");
        return 1;
    }
    reg(fake_evict);
    fail_once();
    int first = calls;
    reg(NULL);
    fail_once();
    printf("FIRST=%d AFTER=%d\n", first, calls - first);
    return 0;
}
