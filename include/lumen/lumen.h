/* lumen/lumen.h — everything public in one include. */
#ifndef LUMEN_LUMEN_H
#define LUMEN_LUMEN_H

#include "lumen/autograd.h"
#include "lumen/base.h"
#include "lumen/env.h"
#include "lumen/graph.h"
#include "lumen/loss.h"
#include "lumen/ops.h"
#include "lumen/optim.h"
#include "lumen/policy.h"
#include "lumen/rand.h"
#include "lumen/rollout.h"
#include "lumen/runtime.h"
#include "lumen/train.h"
#include "lumen/vec.h"

#endif
