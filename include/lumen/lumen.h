/* lumen/lumen.h — everything public in one include. */
#ifndef LUMEN_LUMEN_H
#define LUMEN_LUMEN_H

#include "lumen/base.h"
#include "lumen/graph.h"
#include "lumen/ops.h"
#include "lumen/rand.h"
#include "lumen/runtime.h"

#endif
