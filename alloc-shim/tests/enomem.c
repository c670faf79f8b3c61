/* A failing allocation under the shim returns NULL with errno = ENOMEM,
 * like the real thing (no runtime in this process to evict from). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    errno = 0;
    void *p = malloc((size_t)1 << 46);
    int e1 = errno;
    errno = 0;
    void *q = calloc((size_t)1 << 23, (size_t)1 << 23);
    int e2 = errno;
    void *r = NULL;
    int rc = posix_memalign(&r, 64, (size_t)1 << 46);
    if (p || q || r || e1 != ENOMEM || e2 != ENOMEM || rc != ENOMEM) {
        printf("BAD p=%p e1=%d q=%p e2=%d rc=%d\n", p, e1, q, e2, rc);
        return 1;
    }
    printf("ENOMEM OK\n");
    return 0;
}
