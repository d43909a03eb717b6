// Shared between the server's parts: the job a request becomes, the queue the single worker
// takes jobs from, and the server state the HTTP threads and the worker see.
#pragma once
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/gen_config.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/server.h"

struct cJSON;
struct tokenizer;
struct snap_cache;

// One chat completion. Made by the connection's thread (request parsed, prompt rendered and
// tokenized), computed by the worker, answered by the connection's thread. Two references: the
// connection and the queue/worker; the last to let go frees it.
struct job {
    struct oai_request req;
    int32_t *prompt;
    int n_prompt;
    int turn_start;    // index of the last <|im_start|>: where the new assistant turn begins
    bool in_reasoning; // the prompt ends inside <think>
    char id[48];
    long created;
    double arrived, deadline;
    int fd; // the client's socket, polled for disconnects
    // The connection's thread has read and dropped input from fd (to see a close queued behind
    // it): the connection cannot carry another request and is closed after the response.
    // Touched only by that thread.
    bool discarding;

    atomic_bool cancel; // the client went away

    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *out; // streaming: SSE bytes not yet sent
    size_t out_len, out_pos, out_cap;
    bool started; // the worker took it (a stream's headers go out from then on)
    bool done;
    int status; // the final HTTP status (a stream that failed late still sent 200)
    char *body;
    int refs;
    struct job *next; // queue link
};

struct job_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *head, *tail;
    int n, cap;
    bool stopping;
};

struct server {
    struct server_opts o;
    struct wren_engine *engine;
    struct wren_session *session; // owned by the worker thread
    struct snap_cache *cache;     // owned by the worker thread
    struct tokenizer *tok;
    int chat_flavor;
    int n_ctx;
    struct eos_set eos; // the same end ids as `wren run`
    int32_t im_start, think_end;
    struct sampler_params gen_defaults; // generation_config.json
    char model_name[256];
    struct job_queue queue;
    struct metrics metrics;
    // Shutdown, in order: stopping (no new requests; the queued ones get 503), then, once
    // --shutdown-timeout has passed, shutdown_now (the running request ends with a 503 / an
    // error event). worker_done: the worker thread has returned. in_flight: requests between
    // their first byte and their last response byte (the shutdown waits for them to be sent).
    atomic_bool stopping;
    atomic_bool shutdown_now;
    atomic_bool worker_done;
    atomic_int in_flight;
};

void queue_init(struct job_queue *q, int cap);
// Adds a job (taking a reference); -1 when full or stopping.
int queue_push(struct job_queue *q, struct job *j);
// Blocks for the next job; NULL once stopping.
struct job *queue_pop(struct job_queue *q);
// Takes a waiting job out (its client left); true if it was still waiting.
bool queue_remove(struct job_queue *q, struct job *j);
int queue_depth(struct job_queue *q);
void queue_stop(struct job_queue *q);

struct job *job_new(void);
void job_release(struct job *j);
// Worker side: marks the job taken / appends SSE bytes / finishes the job, waking the
// connection's thread.
void job_start(struct job *j);
void job_emit(struct job *j, const char *data, size_t len);
void job_finish(struct job *j, int status, char *body);

// The worker thread's body: takes jobs one at a time and computes them on the engine.
void *worker_main(void *server);

// Request -> prompt tokens, in the connection's thread. 0, or -1 with err (400 for requests the
// template rejects or that do not fit the context).
int prepare_prompt(struct server *sv, struct job *j, struct oai_error *err);

// Response JSON (the only place besides request.c that knows the OpenAI schema).
char *oai_error_body(const struct oai_error *err);
struct cJSON *oai_chunk(const struct server *sv, const struct job *j);
struct cJSON *oai_usage(int n_prompt, int n_completion, int n_cached);
struct cJSON *oai_tool_call(int index, const char *id, const char *name, const char *args);
struct cJSON *oai_logprob(const struct tokenizer *t, const struct sampled_token *st);
char *oai_models_body(const struct server *sv);
