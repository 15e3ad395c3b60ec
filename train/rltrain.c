/* rltrain: the command-line front end for training.
 * Until environments and training exist it only reports what this build holds: its version and
 * its list of registered environments (empty). Exit codes: 0 success, 2 usage error. */
#include <lumen/lumen.h>

#include <stdio.h>
#include <string.h>

static void print_usage(FILE *out) {
    fputs("usage: rltrain COMMAND\n"
          "\n"
          "commands:\n"
          "  list        list the environments registered in this build\n"
          "  --version   print the lumen version\n"
          "  help        show this help (also -h, --help)\n"
          "\n"
          "Training (rltrain ENV) becomes available once environments are registered.\n",
          out);
}

static int no_extra_args(int argc, char **argv) {
    if (argc <= 2) return 1;
    fprintf(stderr, "rltrain: '%s' takes no arguments, got '%s' (see 'rltrain help')\n",
            argv[1], argv[2]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];

    if (!strcmp(cmd, "help") || !strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        if (!no_extra_args(argc, argv)) return 2;
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        if (!no_extra_args(argc, argv)) return 2;
        printf("lumen %s\n", lm_version());
        return 0;
    }
    if (!strcmp(cmd, "list")) {
        if (!no_extra_args(argc, argv)) return 2;
        puts("no environments are registered in this build yet");
        return 0;
    }
    if (cmd[0] == '-') {
        fprintf(stderr, "rltrain: unknown option '%s' (see 'rltrain help')\n", cmd);
        return 2;
    }
    fprintf(stderr,
            "rltrain: unknown environment '%s': no environments are registered in this build yet "
            "(see 'rltrain list')\n",
            cmd);
    return 2;
}
