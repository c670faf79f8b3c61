/* A program registers an eviction entry point with the shim, then
 * withdraws it with NULL (as a library holding a runtime must before it
 * is unloaded): the shim must not call it afterwards. */
#include <dlfcn.h>

#include "limited.h"

static int calls;

static size_t fake_evict(size_t bytes) {
    (void)bytes;
    calls++;
    return 0;
}

static void fail_once(void) {
    void *held = limit_to_one_block();
    void *p = alloc((size_t)64 << 20);
    unlimit(held);
    free(p);
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
