/* tests/fuzz/fuzz_checkpoint_body.c — fuzz_checkpoint with the checksum made valid before each
 * read, so the fuzzer explores the header text and the arrays behind it (fuzz_checkpoint.c). */
#define FUZZ_FIX_CHECKSUM 1
#include "fuzz_checkpoint.c"
