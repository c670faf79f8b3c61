/* A million random allocation operations from several threads, every
 * block's contents checked. Built and run by tests/shim.rs, with and
 * without LD_PRELOAD=liboutcore_shim.so. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define OPS_PER_THREAD 250000
#define SLOTS 512

typedef struct { unsigned char *p; size_t n; unsigned char tag; } slot;

static unsigned long long next(unsigned long long *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s;
}

static int check(const slot *b) {
    for (size_t i = 0; i < b->n; i++)
        if (b->p[i] != (unsigned char)(b->tag + i)) return 0;
    return 1;
}

static void fill(slot *b) {
    for (size_t i = 0; i < b->n; i++) b->p[i] = (unsigned char)(b->tag + i);
}

static void *worker(void *arg) {
    unsigned long long s = 0x9e3779b97f4a7c15ULL * (uintptr_t)arg + 1;
    slot slots[SLOTS];
    memset(slots, 0, sizeof slots);
    long bad = 0;
    for (long op = 0; op < OPS_PER_THREAD; op++) {
        slot *b = &slots[next(&s) % SLOTS];
        unsigned long long r = next(&s);
        size_t n = (r >> 8) % ((r & 7) == 0 ? 65536 : 512) + 1;
        if (b->p) {
            if (!check(b)) bad++;
            if ((r & 3) == 0) {
                /* realloc keeps the common prefix */
                unsigned char *q = realloc(b->p, n);
                if (!q) { fprintf(stderr, "realloc failed\n"); exit(3); }
                size_t keep = b->n < n ? b->n : n;
                b->p = q;
                for (size_t i = 0; i < keep; i++)
                    if (q[i] != (unsigned char)(b->tag + i)) { bad++; break; }
                b->n = n;
                fill(b);
            } else {
                free(b->p);
                b->p = NULL;
            }
            continue;
        }
        b->tag = (unsigned char)(r >> 40);
        b->n = n;
        switch ((r >> 3) % 8) {
        case 0: b->p = calloc(1, n);
            if (b->p) for (size_t i = 0; i < n; i++) if (b->p[i]) { bad++; break; }
            break;
        case 1: { void *p = NULL; if (posix_memalign(&p, 64, n) == 0) b->p = p;
            if (((uintptr_t)b->p) % 64) bad++; break; }
        case 2: b->p = aligned_alloc(32, (n + 31) / 32 * 32);
            if (((uintptr_t)b->p) % 32) bad++; break;
        case 3: b->p = memalign(128, n); if (((uintptr_t)b->p) % 128) bad++; break;
        case 4: if ((r >> 50) % 64 == 0) { b->p = valloc(n); if (((uintptr_t)b->p) % 4096) bad++; break; }
            /* fall through */
        default: b->p = malloc(n);
        }
        if (!b->p) { fprintf(stderr, "allocation of %zu failed\n", n); exit(3); }
        if (malloc_usable_size(b->p) < n) bad++;
        fill(b);
    }
    for (int i = 0; i < SLOTS; i++) if (slots[i].p) { if (!check(&slots[i])) bad++; free(slots[i].p); }
    return (void *)bad;
}

int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    long bad = 0;
    for (int i = 0; i < THREADS; i++) { void *r; pthread_join(t[i], &r); bad += (long)r; }
    if (bad) { printf("CORRUPT %ld\n", bad); return 1; }
    printf("OK %d ops\n", THREADS * OPS_PER_THREAD);
    return 0;
}
