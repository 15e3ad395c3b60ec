/* rlbench: throughput and time-to-solve benchmarks (DESIGN.md §8).
 * No benchmark exists yet; this stub answers --help and otherwise says so. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
                      !strcmp(argv[1], "help"))) {
        puts("usage: rlbench\n"
             "\n"
             "No benchmarks are built yet; running rlbench reports that and exits with status 2.");
        return 0;
    }
    fputs("rlbench: no benchmarks are built yet\n", stderr);
    return 2;
}
