/* malloc/free throughput: small mixed sizes, a working set of 1024 live
 * blocks, one or more threads. Prints nanoseconds per malloc+free pair.
 * Used by benches/shim.sh with and without LD_PRELOAD. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define OPS 20000000L

static void *work(void *arg) {
    unsigned long long s = 0x9e3779b97f4a7c15ULL + (uintptr_t)arg;
    void *live[1024] = {0};
    for (long i = 0; i < OPS; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        unsigned k = s % 1024;
        free(live[k]);
        live[k] = malloc(16 + (s >> 20) % 512);
        *(volatile char *)live[k] = 1;
    }
    for (int k = 0; k < 1024; k++) free(live[k]);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    pthread_t t[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / OPS);
    return 0;
}
