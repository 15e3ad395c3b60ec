/* rltrain: the command line of lumen (train/cli_main.c); `rltrain help` lists its commands. */
#include <lumen/lumen.h>

int main(int argc, char **argv) { return lm_rltrain(argc, argv); }
