"""The C surface of llama.h that Skippy uses, for cffi API mode.

API mode lets structs end in `...;`: the C compiler fills in layout from the real
(patched) llama.h, so only the fields we touch are declared here and a field
added upstream can never shift our offsets.
"""

CDEF = r"""
typedef int32_t llama_token;
typedef int32_t llama_pos;
typedef int32_t llama_seq_id;

struct llama_model;
struct llama_context;
struct llama_vocab;
typedef struct llama_memory_i * llama_memory_t;

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT, ...
};
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
typedef bool (*ggml_abort_callback)(void * data);

enum llama_flash_attn_type {
    LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED, ...
};

struct llama_model_params {
    int32_t n_gpu_layers;
    int32_t layer_begin;
    int32_t layer_end;
    bool vocab_only;
    bool use_extra_bufts;
    ...;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_flash_attn_type flash_attn_type;
    bool embeddings;
    bool no_perf;
    bool swa_full;
    bool kv_unified;
    bool batch_invariant;
    ...;
};

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

struct llama_chat_message {
    const char * role;
    const char * content;
};

enum llama_memory_component_kind {
    LLAMA_MEMORY_COMPONENT_ATTN, LLAMA_MEMORY_COMPONENT_SWA, LLAMA_MEMORY_COMPONENT_RECURRENT, ...
};
struct llama_memory_component_info {
    int32_t  kind;
    uint32_t size;
    uint32_t used;
    uint64_t bytes;
};

size_t llama_max_parallel_sequences(void);

void llama_backend_init(void);
void llama_log_set(ggml_log_callback log_callback, void * user_data);

struct llama_model_params   llama_model_default_params(void);
struct llama_context_params llama_context_default_params(void);

struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
void llama_model_free(struct llama_model * model);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);

uint32_t llama_n_ctx(const struct llama_context * ctx);
uint32_t llama_n_batch(const struct llama_context * ctx);
uint32_t llama_n_ubatch(const struct llama_context * ctx);
uint32_t llama_n_seq_max(const struct llama_context * ctx);
llama_memory_t llama_get_memory(const struct llama_context * ctx);
void llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
void llama_set_abort_callback(struct llama_context * ctx, ggml_abort_callback abort_callback, void * abort_callback_data);

const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
int32_t llama_model_n_embd(const struct llama_model * model);
int32_t llama_model_n_layer(const struct llama_model * model);
int32_t llama_model_n_head(const struct llama_model * model);
int32_t llama_model_n_head_kv(const struct llama_model * model);
int32_t llama_model_n_swa(const struct llama_model * model);
int32_t llama_model_meta_val_str(const struct llama_model * model, const char * key, char * buf, size_t buf_size);
int32_t llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
uint64_t llama_model_size(const struct llama_model * model);
uint64_t llama_model_loaded_size(const struct llama_model * model);
uint64_t llama_model_n_params(const struct llama_model * model);
const char * llama_model_chat_template(const struct llama_model * model, const char * name);
bool llama_model_is_recurrent(const struct llama_model * model);
bool llama_model_is_hybrid(const struct llama_model * model);

int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
llama_token llama_vocab_bos(const struct llama_vocab * vocab);
llama_token llama_vocab_eos(const struct llama_vocab * vocab);
bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
                             int32_t length, int32_t lstrip, bool special);
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                         char * text, int32_t text_len_max, bool remove_special, bool unparse_special);
int32_t llama_chat_apply_template(const char * tmpl, const struct llama_chat_message * chat, size_t n_msg,
                                  bool add_ass, char * buf, int32_t length);

void llama_memory_clear(llama_memory_t mem, bool data);
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1);
void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);
int32_t llama_memory_ledger(llama_memory_t mem, struct llama_memory_component_info * out, int32_t n_max);

size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id);
size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id);

int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);

/* [skippy] test only (patches/0008) */
enum llama_test_fault_kind {
    LLAMA_TEST_FAULT_NONE, LLAMA_TEST_FAULT_COMPUTE, LLAMA_TEST_FAULT_ABORT, LLAMA_TEST_FAULT_KV_SLOT, ...
};
int32_t llama_test_fault_arm(struct llama_context * ctx, int32_t kind, int32_t after, int32_t count);
int32_t llama_test_fault_fired(const struct llama_context * ctx);
float * llama_get_logits(struct llama_context * ctx);
float * llama_get_embeddings(struct llama_context * ctx);

/* ours, in the extension's C source */
extern "Python" void skippy_log_callback(enum ggml_log_level level, const char * text, void * user_data);
void skippy_bind_seq_ids(llama_seq_id ** ptrs, llama_seq_id * flat, int32_t n);
bool skippy_abort_if_flag(void * data);
int32_t skippy_check_batch(llama_memory_t mem, struct llama_batch batch, int32_t n_vocab, int32_t n_seq_max,
                           int32_t * bad);
"""

C_SOURCE = r"""
#include "llama.h"

/* Point each token's seq-id slot at one int32 in a flat array, once per batch
   allocation, so per-step filling is a numpy copy with no per-token Python loop. */
static void skippy_bind_seq_ids(llama_seq_id ** ptrs, llama_seq_id * flat, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
        ptrs[i] = flat + i;
    }
}

/* What Context._validate checks before a llama_decode, in C: run between two decodes, the same checks
   in numpy cost about 0.1 ms per step of cache-cold interpreter work (bench/results/lean-step).
   Returns 0, or the first failing check: 1 a token outside [0, n_vocab) (not checked when the batch
   carries hidden states), 2 a seq id outside [0, n_seq_max), 3 a negative position, 4 a sequence's
   positions not consecutive and increasing within the batch, 5 a sequence that does not continue its
   memory (bad[1] = where the memory ends); -1 more than 256 sequences. bad[0] = the index of the offending token. Each check runs
   over the whole batch before the next, in _validate's order. */
static int32_t skippy_check_batch(llama_memory_t mem, struct llama_batch batch, int32_t n_vocab,
                                  int32_t n_seq_max, int32_t * bad) {
    const int32_t n = batch.n_tokens;
    if (batch.token != NULL) {
        for (int32_t i = 0; i < n; ++i) {
            if (batch.token[i] < 0 || batch.token[i] >= n_vocab) { bad[0] = i; return 1; }
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        const llama_seq_id s = batch.seq_id[i][0];
        if (s < 0 || s >= n_seq_max) { bad[0] = i; return 2; }
    }
    for (int32_t i = 0; i < n; ++i) {
        if (batch.pos[i] < 0) { bad[0] = i; return 3; }
    }
    /* at[s]: the index of sequence s's token seen last in the batch, -1 before its first */
    int32_t at[256];  /* llama.cpp's LLAMA_MAX_SEQ: no context has more sequences */
    if (n_seq_max > 256) { bad[0] = -1; return -1; }
    for (int32_t s = 0; s < n_seq_max; ++s) { at[s] = -1; }
    int32_t code = 0;
    for (int32_t i = 0; i < n && code == 0; ++i) {  /* each token continues its sequence's last one */
        const llama_seq_id s = batch.seq_id[i][0];
        if (at[s] >= 0 && batch.pos[i] != batch.pos[at[s]] + 1) { bad[0] = i; code = 4; }
        at[s] = i;
    }
    for (int32_t s = 0; s < n_seq_max; ++s) { at[s] = -1; }
    for (int32_t i = 0; i < n && code == 0; ++i) {  /* each sequence's first token continues its memory */
        const llama_seq_id s = batch.seq_id[i][0];
        if (at[s] >= 0) { continue; }
        at[s] = i;
        const llama_pos last = llama_memory_seq_pos_max(mem, s);
        if (last >= 0 && batch.pos[i] != last + 1) { bad[0] = i; bad[1] = last; code = 5; }
    }
    return code;
}

/* Abort callback that reads a flag set from Python: no GIL round trip per graph node. */
static bool skippy_abort_if_flag(void * data) {
    return __atomic_load_n((volatile int *) data, __ATOMIC_RELAXED) != 0;
}
"""
