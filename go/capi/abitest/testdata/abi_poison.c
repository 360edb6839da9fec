// A caller passes a bad out-pointer: the export faults inside Go, recovers,
// reports ZCT_E_INTERNAL, and poisons the library so that every later call
// fails cleanly instead of touching possibly inconsistent state.
#include <stdio.h>
#include <string.h>
#include "zctipc.h"

int main(void) {
    unsigned char header[128] = {0x49, 0x54, 0x43, 0x5A, 1}; /* magic and version only: corrupt */
    zct_info info;
    if (zct_header_decode(header, sizeof header, sizeof header, &info) != ZCT_E_CORRUPT) {
        puts("a truncated header was not reported as corrupt");
        return 1;
    }
    /* A valid header, decoded into a pointer no one may write through (the
       tests run the program in the module's root). */
    FILE *f = fopen("tests/golden/float32_2x3.bin", "rb");
    if (f == NULL) {
        puts("cannot open golden vector");
        return 1;
    }
    unsigned char seg[4096];
    size_t n = fread(seg, 1, sizeof seg, f);
    fclose(f);
    int rc = zct_header_decode(seg, n, n, (zct_info *)16);
    if (rc != ZCT_E_INTERNAL || strstr(zct_last_error(), "poisoned") == NULL) {
        printf("bad pointer: status %d, message %s\n", rc, zct_last_error());
        return 1;
    }
    uint64_t len = 0;
    rc = zct_segment_list(NULL, 0, &len);
    if (rc != ZCT_E_POISONED) {
        printf("after a panic: status %d, want ZCT_E_POISONED\n", rc);
        return 1;
    }
    if (zct_abi_version() != ZCT_ABI_VERSION) {
        puts("zct_abi_version still answers");
        return 1;
    }
    puts("ok");
    return 0;
}
