/* A C program built against outcore.h. The entry points are declared weak,
 * so the program runs with or without an outcore runtime in the process:
 *
 *   cc -I alloc-shim/include -o usage alloc-shim/examples/usage.c
 *   ./usage
 *   LD_PRELOAD=target/release/liboutcore_shim.so OUTCORE_MEM_CAP=64MiB ./usage
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outcore.h"

#pragma weak outcore_evict
#pragma weak outcore_usage
#pragma weak outcore_cap
#pragma weak outcore_shim_usage

int main(void) {
    /* Some C allocations: under the shim with OUTCORE_MEM_CAP they are
     * counted, and crossing the cap would make a runtime evict. */
    enum { BLOCKS = 16, SIZE = 1 << 20 };
    char *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(SIZE);
        if (!blocks[i]) { perror("malloc"); return 1; }
        memset(blocks[i], i, SIZE);
    }
    if (outcore_shim_usage)
        printf("shim loaded: %zu bytes of C allocations counted\n", outcore_shim_usage());
    else
        printf("shim not loaded\n");
    if (outcore_evict && outcore_usage) {
        printf("outcore runtime: %zu bytes in use, cap %zu\n", outcore_usage(), outcore_cap ? outcore_cap() : 0);
        printf("asked for 64 MiB, %zu bytes freed\n", outcore_evict(64u << 20));
    } else {
        printf("no outcore runtime in this process\n");
    }
    for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
    return 0;
}
