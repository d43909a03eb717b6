// The bounded FIFO of waiting requests and the job hand-off between a connection's thread and
// the worker. Jobs are reference counted so that either side may finish first.
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"
#include "util/util.h"

void queue_init(struct job_queue *q, int cap) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->cap = cap;
}

int queue_push(struct job_queue *q, struct job *j) {
    pthread_mutex_lock(&q->mu);
    if (q->stopping || q->n >= q->cap) {
        pthread_mutex_unlock(&q->mu);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->n++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

struct job *queue_pop(struct job_queue *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
    struct job *j = NULL;
    if (!q->stopping) {
        j = q->head;
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        q->n--;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

bool queue_remove(struct job_queue *q, struct job *j) {
    bool found = false;
    pthread_mutex_lock(&q->mu);
    for (struct job **p = &q->head, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
        if (*p != j) continue;
        *p = j->next;
        if (q->tail == j) q->tail = prev;
        q->n--;
        found = true;
        break;
    }
    pthread_mutex_unlock(&q->mu);
    if (found) job_release(j);
    return found;
}

int queue_depth(struct job_queue *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void queue_stop(struct job_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    struct job *j = q->head;
    q->head = q->tail = NULL;
    q->n = 0;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    while (j) {
        struct job *next = j->next;
        job_finish(j, 503, NULL);
        job_release(j);
        j = next;
    }
}

struct job *job_new(void) {
    struct job *j = xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, false);
    j->refs = 1;
    j->fd = -1;
    return j;
}

void job_release(struct job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    oai_request_free(&j->req);
    free(j->prompt);
    free(j->out);
    free(j->body);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_start(struct job *j) {
    pthread_mutex_lock(&j->mu);
    j->started = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void job_emit(struct job *j, const char *data, size_t len) {
    pthread_mutex_lock(&j->mu);
    if (j->out_pos == j->out_len) j->out_pos = j->out_len = 0;
    if (j->out_pos > j->out_len / 2) { // a reader that lags: keep only the unread part
        memmove(j->out, j->out + j->out_pos, j->out_len - j->out_pos);
        j->out_len -= j->out_pos;
        j->out_pos = 0;
    }
    if (j->out_len + len > j->out_cap) {
        j->out_cap = (j->out_len + len) * 2;
        j->out = xrealloc(j->out, j->out_cap);
    }
    memcpy(j->out + j->out_len, data, len);
    j->out_len += len;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void job_finish(struct job *j, int status, char *body) {
    pthread_mutex_lock(&j->mu);
    if (!j->done) {
        j->done = true;
        j->status = status;
        j->body = body;
        body = NULL;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(body);
}
