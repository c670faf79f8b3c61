/* Allocations that fail under an address-space limit the program sets
 * itself (each smaller than that limit, so the shim asks for an eviction
 * when it can): NULL with errno = ENOMEM. */
#include <errno.h>

#include "limited.h"

int main(void) {
    int fails = 0;
    void *held = limit_to_one_block();
    for (int i = 0; i < 3; i++) {
        errno = 0;
        void *p = alloc((size_t)64 << 20);
        if (!p && errno == ENOMEM)
            fails++;
        free(p);
    }
    unlimit(held);
    if (!held || fails != 3) {
        printf("BAD %d\n", fails);
        return 1;
    }
    printf("ENOMEM OK\n");
    return 0;
}
