/* lumen/policy.h — actor-critic policies as graphs: MLP trunks (separate or shared, tanh or
 * relu), optionally after a 3x3 convolution over image observations (MinAtar's network), a
 * categorical head for discrete actions and a diagonal-Gaussian head (state-free
 * log-std) for boxes, sampling through RAND, log-probs and entropies, and CleanRL-style
 * orthogonal initialisation written into a program's parameters. The same builder serves
 * the rollout (N envs) and the update (a minibatch): parameters are PARAM inputs with fixed
 * names, so programs can link them (lm_program_link). */
#ifndef LUMEN_POLICY_H
#define LUMEN_POLICY_H

#include "lumen/env.h"
#include "lumen/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LM_POLICY_MAX_LAYERS 4
#define LM_POLICY_MAX_PARAMS 24

typedef enum lm_activation { LM_ACT_TANH, LM_ACT_RELU } lm_activation;

typedef struct lm_policy_config {
  int hidden[LM_POLICY_MAX_LAYERS]; /* widths of the hidden layers */
  int layers;                       /* how many of hidden[] are used (1..4) */
  lm_activation activation;
  int shared;                       /* one trunk for actor and critic */
  int conv;                         /* filters of a 3x3 convolution (stride 1, SAME, relu) over the
                                     * image observation before the hidden layers; 0: none */
  int contract;                     /* the rollout's graph may fuse a*b + c into FMAs where its
                                     * step runs as a plan (lm_graph_set_contraction); 0: the
                                     * reference's rounding. PPO sets it unless exact. */
} lm_policy_config;

/* The CleanRL default: two hidden layers of 64, tanh, separate trunks. */
lm_policy_config lm_policy_default(void);

typedef struct lm_policy {
  lm_policy_config cfg;
  int obs_size;
  int image[3];                         /* the observation as height, width, channels (conv) */
  lm_space action;
  int nparams;
  lm_tensor param[LM_POLICY_MAX_PARAMS];
  char name[LM_POLICY_MAX_PARAMS][24];  /* "pi.w0", "v.b1", "pi.log_std", ... */
  float gain[LM_POLICY_MAX_PARAMS];     /* orthogonal gain for weights, 0 for biases */
  int rows[LM_POLICY_MAX_PARAMS], cols[LM_POLICY_MAX_PARAMS]; /* cols = 0: a vector */
} lm_policy;

/* Declares the parameters (PARAM inputs) of a policy for env's observations and actions in g. A
 * convolution (cfg->conv) needs an image observation: obs_rank 3, height x width x channels. */
lm_status lm_policy_build(lm_graph_t *g, const lm_policy_config *cfg, const lm_env_spec *env, lm_policy *out);

typedef struct lm_policy_out {
  lm_tensor logits;  /* discrete: [B, n] */
  lm_tensor mean;    /* box: [B, n] */
  lm_tensor log_std; /* box: [n] */
  lm_tensor value;   /* [B] */
} lm_policy_out;

lm_status lm_policy_forward(const lm_policy *p, lm_tensor obs, lm_policy_out *out);
/* Only the critic (for bootstrapping values of observations). */
lm_tensor lm_policy_value(const lm_policy *p, lm_tensor obs);
/* Draws actions with RAND stream `stream` (discrete: inverse CDF, [B] indices as floats;
 * box: Box-Muller, [B, n], not clipped), and their log-probabilities [B]. */
lm_tensor lm_policy_sample(const lm_policy *p, const lm_policy_out *o, uint32_t stream, lm_tensor *logp);
lm_tensor lm_policy_log_prob(const lm_policy *p, const lm_policy_out *o, lm_tensor action);
lm_tensor lm_policy_entropy(const lm_policy *p, const lm_policy_out *o);

/* Orthogonal weights (gain sqrt 2 in the trunks, 0.01 on the policy head, 1 on the value
 * head), zero biases and log-std, written into the program's parameters. */
lm_status lm_policy_init(const lm_policy *p, lm_program_t *prog, uint64_t seed);
/* Element count of parameter i. */
size_t lm_policy_param_size(const lm_policy *p, int i);

#ifdef __cplusplus
}
#endif
#endif
