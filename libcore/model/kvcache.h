/* kvcache.h — the paged KV cache. Keys and values live in fixed-size blocks taken
   from one pool; each sequence has a block table. Every layer records how far it is
   filled, because AdaDecode fills the layers of one position at different times.
   Slot i of a sequence holds position i once a step is accepted; a token tree in
   flight occupies the slots after the accepted ones until kv_keep_path compacts the
   accepted branch.
   Within a block, keys and values are stored transposed ([kv_dim][block_size]) so
   attention takes a block's slots 16 at a time.
   The elements are f32, bf16 or int8 (KVType, kernels/backend.h states the rounding);
   an int8 cache keeps one f32 scale per slot and kv head, per block transposed the same
   way ([n_kv_heads][block_size]), and every slot move moves the scales with the values.
   The cache lives on a device of the runners' kind, on a stream of its own: its table
   uploads and slot moves have finished when the call returns, so a runner's next
   forward pass sees them (and the caller has read the last pass's results first).

   Prefix cache: a full block whose every layer is filled can be published under the
   tokens it holds and the blocks before it; a new sequence whose tokens start the same
   way attaches those blocks instead of computing them again (the forward pass is batch
   invariant, so the attached keys and values are the bits a recomputation would give).
   Blocks are reference-counted; one no sequence holds stays published, idle, until the
   pool needs it (least recently used first). A hash only finds a candidate: attaching
   compares the block's tokens and its predecessor (block id and generation, bumped
   whenever a block's contents may change), so a collision is a miss, never a wrong
   answer. A sequence cut inside a block it shares gets its own copy of that block first
   (copy on write).
   A cache may also keep each published slot's state after the last layer (kv_prefix_states):
   a method that reads the prompt's states (EAGLE's head) then attaches a prefix too, and
   takes the states a recomputation would give (published blocks never change). */
#ifndef PD_KVCACHE_H
#define PD_KVCACHE_H
#include "backend.h"
#include "device.h"
#include "model/model.h"

typedef struct {
    int n_layers, kv_dim, block_size, n_kv_heads;
    int n_blocks, max_seqs, max_blocks; /* pool size, sequences, blocks per sequence */
    KVType type;
    int elem; /* bytes an element: 4, 2 or 1 */
    /* k, v, ks, vs: device addresses (the host reads them through kv_read) */
    void *k;          /* [n_blocks][n_layers][kv_dim][block_size] elements */
    void *v;          /* [n_blocks][n_layers][kv_dim][block_size] */
    float *ks;        /* q8_0: [n_blocks][n_layers][n_kv_heads][block_size] key scales */
    float *vs;        /* q8_0: the values' */
    int *free_blocks; /* [n_blocks] stack of free block ids (neither held nor published) */
    int n_free;
    int *ref; /* [n_blocks] sequences holding the block */
    /* the prefix cache (kv_prefix_*): a published block's hash (0: not published), its
       tokens, its predecessor's id and generation; map: open addressing by hash, block
       ids (-1: empty); lru: the published blocks nobody holds, oldest first */
    uint64_t *hash;       /* [n_blocks] */
    int32_t *btok;        /* [n_blocks][block_size] */
    int *prev, *prev_gen; /* [n_blocks] -1: the first block of a sequence */
    int *gen;             /* [n_blocks] */
    int *map, map_cap;    /* [map_cap], a power of two ≥ 2 n_blocks */
    int *lru_prev, *lru_next, lru_head, lru_tail;
    int n_idle;                          /* published blocks nobody holds (in the lru) */
    int64_t prefix_queried, prefix_hits; /* blocks looked up and found by kv_prefix_attach */
    int state_dim;                       /* 0: no states kept */
    float *states;                       /* [n_blocks][block_size][state_dim] a published block's */
    uint8_t *stated;                     /* [n_blocks] its states are in */
    int *table;                          /* [max_seqs][max_blocks] block ids */
    int *n_table;                        /* [max_seqs] blocks held */
    int *len;                            /* [max_seqs][n_layers] filled slots per layer */
    char *live;                          /* [max_seqs] */
    Arena arena;
    /* the storage as device buffers (on the CPU k and v wrapped in place) and the
       slot moves' list, {src, dst} element indices, grown on demand; the scales' list
       (q8_0) shares the count at the start of moves */
    Device *dev; /* a device of the kind runners get (model_device), its own stream */
    DevBuf kbuf, vbuf, moves, ksbuf, vsbuf, smoves;
    DevBuf tbuf; /* the block tables where kernels read them (on the CPU, table itself) */
    size_t cap_moves;
} KVCache;

/* room for max_tokens slots in all, shared by up to max_seqs sequences, each at most
   seq_len slots (the model's context) */
int kv_init(KVCache *kv, const Config *c, int max_seqs, int max_tokens, int block_size);
/* the same for a cache of type t (kv_init: f32) */
int kv_init_typed(KVCache *kv, const Config *c, int max_seqs, int max_tokens, int block_size, KVType t);
/* "f32", "bf16", "q8_0" → the type; -1 with the error set otherwise */
int kv_type_parse(const char *name);
const char *kv_type_name(KVType t);
/* bytes one position takes in one layer, keys and values: 2 × kv_dim × 4 (f32),
   2 × kv_dim × 2 (bf16), 2 × (kv_dim + 4 × n_kv_heads) (q8_0) */
size_t kv_bytes_per_token_layer(KVType t, int kv_dim, int n_kv_heads);
void kv_free(KVCache *kv);
int kv_seq_new(KVCache *kv);            /* a sequence id, or -1 when none is free */
void kv_seq_free(KVCache *kv, int seq); /* its blocks go back to the pool */
int kv_len(const KVCache *kv, int seq, int layer);
int kv_reserve(KVCache *kv, int seq, int slots); /* blocks for slots [0, slots) */
/* [kv_dim] each, rounded or quantized as the forward pass writes; tests */
void kv_write(KVCache *kv, int seq, int layer, int slot, const float *k, const float *v);
/* what attention reads (widened or dequantized); tests */
void kv_read(const KVCache *kv, int seq, int layer, int slot, float *k, float *v);
const int *kv_table(const KVCache *kv, int seq);     /* the sequence's block ids */
const int *kv_table_dev(const KVCache *kv, int seq); /* the same where the kernels read them */
size_t kv_block_stride(const KVCache *kv);           /* elements between blocks of one layer */
void *kv_layer_k(const KVCache *kv, int layer);      /* block 0's keys of this layer */
void *kv_layer_v(const KVCache *kv, int layer);
size_t kv_scale_stride(const KVCache *kv);        /* q8_0: floats between blocks' scales */
float *kv_layer_ks(const KVCache *kv, int layer); /* q8_0: block 0's key scales (NULL otherwise) */
float *kv_layer_vs(const KVCache *kv, int layer);
void kv_set_len(KVCache *kv, int seq, int layer, int len);
/* rollback: every layer keeps at most len slots; whole blocks past it are freed (the
   storage does not move: a device only forgets) */
int kv_truncate(KVCache *kv, int seq, int len);
/* keep an accepted branch: slots base+path[i] move to base+i (path increasing),
   then every layer is cut to base+n. The moves, every layer's, are one device call on
   the keys and one on the values */
int kv_keep_path(KVCache *kv, int seq, int base, const int *path, int n);
/* a copy of seq's first len slots into a new sequence (prefix reuse, tests): device
   moves, as kv_keep_path's */
int kv_fork(KVCache *kv, int seq, int len);
/* blocks a sequence can still take: the free ones and the idle published ones */
int kv_blocks_available(const KVCache *kv);
/* an empty sequence takes the published blocks that hold tok's first full blocks, at
   most n tokens' worth (whole blocks); returns the tokens it now holds in every layer.
   states non-NULL: only blocks that keep their states, which go to states[got][state_dim] */
int kv_prefix_attach(KVCache *kv, int seq, const int32_t *tok, int n, float *states);
/* publishes seq's full blocks among its first n slots, which hold tok[0..n) in every
   layer, from the start up to the first block published elsewhere already; a cache that
   keeps states takes those of the blocks within states[n_states][state_dim] (NULL: none) */
void kv_prefix_publish(KVCache *kv, int seq, const int32_t *tok, int n, const float *states, int n_states);
/* published blocks keep their slots' states of dim floats from now on (host memory,
   mapped as blocks are published) */
int kv_prefix_states(KVCache *kv, int dim);

#endif
