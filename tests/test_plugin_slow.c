/* The long run of the plugin suite (label slow): tests/plugins/catch_pixels.c, a graph-only env
 * with a 50-float observation, trained through `rltrain FILE.c` with lumen's defaults until it is
 * solved. The machinery lives in test_plugin.c, included here with its always-on tests compiled
 * out. */
#define LUMEN_PLUGIN_SLOW 1
#include "test_plugin.c"
