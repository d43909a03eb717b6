// libmicrohttpd glue: routing, authentication, body limits, SSE streaming, and noticing clients
// that go away (their job is cancelled and leaves the queue or stops within one token).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "server/http.h"
#include "server/internal.h"
#include "util/util.h"

#define POLL_MS 50 // how often a waiting connection checks that its client is still there
// Unread input a waiting connection leaves alone: room for a pipelined request, and far less
// than a receive buffer holds, so a FIN sent behind it still gets in (see client_gone).
#define KEEP_UNREAD (16 << 10)
#define DISCARD_MAX (4 << 20) // input dropped per check at most: a sender cannot pin the thread
// Keepalive probes after --keepalive idle seconds: KEEPALIVE_PROBES of them, KEEPALIVE_INTERVAL
// seconds apart, go unanswered before the connection is dropped.
#define KEEPALIVE_INTERVAL 5
#define KEEPALIVE_PROBES   3

// Answered from the headers alone, before the body is read (the rest of it is dropped).
enum refusal { REFUSE_NONE, REFUSE_TOO_LARGE, REFUSE_STOPPING };

struct req_ctx {
    char *body;
    size_t len, cap;
    enum refusal refused;
};

// Queues r. While the server stops, every response closes its connection: a keep-alive client
// (a load balancer's connection pool) then connects anew and can find a server that is up.
// `close`: the connection's input was dropped, so it cannot carry another request.
static enum MHD_Result queue(struct server *sv, struct MHD_Connection *c, int status,
                             struct MHD_Response *r, bool close) {
    if (close || atomic_load(&sv->stopping)) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static struct MHD_Response *body_response(const char *type, char *body) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    return r;
}

static enum MHD_Result send_body(struct server *sv, struct MHD_Connection *c, int status,
                                 const char *type, char *body) {
    return queue(sv, c, status, body_response(type, body), false);
}

static enum MHD_Result send_error(struct server *sv, struct MHD_Connection *c,
                                  const struct oai_error *err) {
    return send_body(sv, c, err->status, "application/json", oai_error_body(err));
}

static enum MHD_Result error(struct server *sv, struct MHD_Connection *c, int status,
                             const char *type, const char *fmt, const char *arg) {
    struct oai_error err;
    oai_errorf(&err, status, type, NULL, fmt, arg);
    return send_error(sv, c, &err);
}

static enum MHD_Result too_large(struct server *sv, struct MHD_Connection *c) {
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", sv->o.max_body);
    return error(sv, c, 413, "invalid_request_error",
                 "the request body is larger than the limit of %s bytes (--max-body)", limit);
}

static enum MHD_Result shutting_down(struct server *sv, struct MHD_Connection *c) {
    return error(sv, c, 503, "server_error", "%s", "the server is shutting down");
}

static int unread_bytes(int fd) {
    int n = 0;
    return ioctl(fd, FIONREAD, &n) ? 0 : n;
}

// Reads and drops up to DISCARD_MAX bytes of input; true at its end (the client closed) or on
// an error such as a reset.
static bool discard_input(int fd) {
    char buf[16384];
    for (size_t total = 0; total < DISCARD_MAX;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) return true;
        if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        total += (size_t)n;
    }
    return false;
}

// The client closed its end (FIN) or reset the connection. POLLRDHUP reports the FIN even when
// unread bytes (a pipelined request, stray data) are queued before it, where peeking at the next
// byte would only see the data; nothing is consumed, so a request pipelined by a client that is
// still there stays intact for libmicrohttpd. But a FIN only gets in while the receive buffer
// has room: a client that sent more than the buffers hold and then closed has its FIN stuck in
// its own send queue, behind bytes nobody reads, until it times out. So once more than
// KEEP_UNREAD bytes wait, the connection drops its input from then on (a conforming client
// pipelines nothing behind a POST, so nothing of value is lost): the rest and the FIN come in,
// and the end of the input shows that the client left.
static bool client_gone(struct job *j) {
    if (j->fd < 0) return false;
    struct pollfd p = {.fd = j->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false; // nothing to report (or EINTR: look again next time)
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (!(p.revents & POLLIN)) return false;
    if (!j->discarding && unread_bytes(j->fd) <= KEEP_UNREAD) return false;
    j->discarding = true;
    return discard_input(j->fd);
}

static void wait_a_little(struct job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

struct stream {
    struct server *sv;
    struct job *j;
};

static void abandon(struct server *sv, struct job *j) {
    atomic_store(&j->cancel, true);
    if (queue_remove(&sv->queue, j)) metrics_request(&sv->metrics, OUT_CANCELLED);
}

static bool is_done(const struct job *j) {
    return j->done;
}

static bool is_started(const struct job *j) {
    return j->started || j->done;
}

// Waits, checking the client every POLL_MS, until `until` holds for the job; false when the
// client went away first (the job is then abandoned: it leaves the queue or stops generating).
static bool wait_for(struct server *sv, struct job *j, bool (*until)(const struct job *)) {
    pthread_mutex_lock(&j->mu);
    while (!until(j)) {
        wait_a_little(j);
        if (!until(j) && client_gone(j)) {
            pthread_mutex_unlock(&j->mu);
            abandon(sv, j);
            return false;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *st = cls;
    struct job *j = st->j;
    pthread_mutex_lock(&j->mu);
    while (j->out_pos == j->out_len && !j->done) {
        wait_a_little(j);
        if (j->out_pos == j->out_len && !j->done && client_gone(j)) {
            pthread_mutex_unlock(&j->mu);
            abandon(st->sv, j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = j->out_len - j->out_pos;
    if (n > max) n = max;
    memcpy(buf, j->out + j->out_pos, n);
    j->out_pos += n;
    pthread_mutex_unlock(&j->mu);
    return n ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

static void stream_free(void *cls) {
    struct stream *st = cls;
    abandon(st->sv, st->j);
    job_release(st->j);
    free(st);
}

static int client_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

// The SSE response; the job's reference passes to it (dropped in stream_free).
static enum MHD_Result start_stream(struct server *sv, struct MHD_Connection *c, struct job *j) {
    struct stream *st = xmalloc(sizeof *st);
    *st = (struct stream){sv, j};
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return queue(sv, c, MHD_HTTP_OK, r, j->discarding);
}

// The finished job's JSON response, and the job released. Jobs ended without a body: the
// client left (499: nothing to answer) or the queue was emptied at shutdown (503).
static enum MHD_Result answer(struct server *sv, struct MHD_Connection *c, struct job *j) {
    pthread_mutex_lock(&j->mu);
    int status = j->status;
    char *body = j->body;
    j->body = NULL;
    pthread_mutex_unlock(&j->mu);
    bool close = j->discarding;
    job_release(j);
    if (body) return queue(sv, c, status, body_response("application/json", body), close);
    if (status == 499) return MHD_NO;
    return shutting_down(sv, c);
}

static enum MHD_Result chat_completions(struct server *sv, struct MHD_Connection *c,
                                        struct req_ctx *rc) {
    struct oai_error err = {0};
    struct oai_limits lim = {sv->o.max_messages, sv->o.max_body};
    struct job *j = job_new();
    j->arrived = now_sec();
    j->deadline = j->arrived + sv->o.timeout_s;
    j->fd = client_fd(c);
    if (oai_request_parse(rc->body ? rc->body : "", rc->len, &lim, sv->o.test_replay, &j->req,
                          &err) ||
        prepare_prompt(sv, j, &err)) {
        job_release(j);
        metrics_request(&sv->metrics, OUT_CLIENT_ERROR);
        return send_error(sv, c, &err);
    }
    if (queue_push(&sv->queue, j)) {
        job_release(j);
        metrics_request(&sv->metrics, OUT_REJECTED);
        if (atomic_load(&sv->stopping)) return shutting_down(sv, c);
        return error(sv, c, 429, "rate_limit_exceeded", "%s",
                     "the request queue is full; retry later");
    }
    // From here the connection waits on the model, not on the client: the idle timeout (meant
    // for clients that stall while sending) becomes the request timeout, with slack so that
    // the worker's own deadline ends the response properly first.
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)sv->o.timeout_s + 30);
    // A stream's 200 goes out only once the worker takes the job: until then it can still fail
    // as a whole (503 when the server stops while it waits) with a plain JSON error.
    if (!wait_for(sv, j, j->req.stream ? is_started : is_done)) {
        job_release(j);
        return MHD_NO;
    }
    pthread_mutex_lock(&j->mu);
    bool stream = j->req.stream && j->started;
    pthread_mutex_unlock(&j->mu);
    return stream ? start_stream(sv, c, j) : answer(sv, c, j);
}

static bool authorized(struct server *sv, struct MHD_Connection *c) {
    if (!sv->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t n = strlen(sv->o.api_key);
    if (strlen(h) != n) return false;
    unsigned char diff = 0; // constant time: the key's bytes are not revealed by timing
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(h[i] ^ sv->o.api_key[i]);
    return diff == 0;
}

// A request answered from its headers alone, before its body is read: while the server stops,
// anything but /metrics (which shows the drain), at once even when a large body is still on its
// way; and a declared body over --max-body.
static enum refusal early_refusal(struct server *sv, struct MHD_Connection *c, const char *url) {
    if (atomic_load(&sv->stopping) && strcmp(url, "/metrics")) return REFUSE_STOPPING;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > sv->o.max_body) return REFUSE_TOO_LARGE;
    return REFUSE_NONE;
}

static enum MHD_Result refuse(struct server *sv, struct MHD_Connection *c, enum refusal why) {
    return why == REFUSE_STOPPING ? shutting_down(sv, c) : too_large(sv, c);
}

// 503 once a shutdown has begun, so that load balancers stop routing here while the running
// request drains (never needs the API key).
static enum MHD_Result health(struct server *sv, struct MHD_Connection *c) {
    if (atomic_load(&sv->stopping)) return shutting_down(sv, c);
    return send_body(sv, c, 200, "application/json", xstrdup("{\"status\":\"ok\"}"));
}

static void append_upload(struct server *sv, struct req_ctx *rc, const char *upload, size_t n) {
    if (rc->refused || rc->len + n > sv->o.max_body) {
        if (!rc->refused) rc->refused = REFUSE_TOO_LARGE; // the rest of the body is dropped
        return;
    }
    if (rc->len + n + 1 > rc->cap) {
        rc->cap = (rc->len + n + 1) * 2;
        if (rc->cap > sv->o.max_body + 1) rc->cap = sv->o.max_body + 1;
        rc->body = xrealloc(rc->body, rc->cap);
    }
    memcpy(rc->body + rc->len, upload, n);
    rc->len += n;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    struct server *sv = cls;
    struct req_ctx *rc = *con_cls;
    if (!rc) {
        rc = xcalloc(1, sizeof *rc);
        *con_cls = rc;
        atomic_fetch_add(&sv->in_flight, 1); // until completed() is told the response is out
        rc->refused = early_refusal(sv, c, url);
        return rc->refused ? refuse(sv, c, rc->refused) : MHD_YES;
    }
    if (*upload_size) {
        append_upload(sv, rc, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->refused) return refuse(sv, c, rc->refused);
    if (!strcmp(url, "/health")) return health(sv, c);
    if (!authorized(sv, c))
        return error(sv, c, 401, "invalid_request_error", "%s",
                     "missing or wrong API key (Authorization: Bearer ...)");
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/v1/models") && get)
        return send_body(sv, c, 200, "application/json", oai_models_body(sv));
    if (!strcmp(url, "/metrics") && get)
        return send_body(sv, c, 200, "text/plain; version=0.0.4",
                         metrics_text(&sv->metrics, queue_depth(&sv->queue)));
    if (!strcmp(url, "/v1/chat/completions") && post) {
        if (rc->body) rc->body[rc->len] = 0;
        return chat_completions(sv, c, rc);
    }
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/metrics") ||
        !strcmp(url, "/v1/chat/completions"))
        return error(sv, c, 405, "invalid_request_error", "method %s not allowed here", method);
    return error(sv, c, 404, "invalid_request_error", "%s", "unknown endpoint");
}

// The request is over: its response was sent, or the connection failed or was closed.
static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    struct server *sv = cls;
    struct req_ctx *rc = *con_cls;
    if (!rc) return;
    free(rc->body);
    free(rc);
    *con_cls = NULL;
    atomic_fetch_sub(&sv->in_flight, 1);
}

void http_drain(struct server *sv, double seconds) {
    double end = now_sec() + seconds;
    struct timespec tick = {0, POLL_MS * 1000000L};
    while (atomic_load(&sv->in_flight) > 0 && now_sec() < end) nanosleep(&tick, NULL);
}

// A client whose host or network vanished sends no FIN and no reset: without keepalive its
// connection would look alive, and the engine generate for nobody, until --timeout. Keepalive
// covers a connection with nothing in flight (queued, or computing a non-streamed answer);
// TCP_USER_TIMEOUT bounds how long sent data (a stream) may go unacknowledged, by the time the
// probes take to fail, so that both end alike (with it set, Linux ends keepalive by that time
// too, and also a zero window held that long). The kernel then aborts the socket, which polls
// POLLERR and POLLHUP: client_gone() sees it within POLL_MS, and libmicrohttpd's next send
// fails. A setsockopt that fails only leaves the connection as it was before keepalive existed,
// not worth refusing the client for.
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
    (void)socket_ctx;
    struct server *sv = cls;
    int fd = code == MHD_CONNECTION_NOTIFY_STARTED && sv->o.keepalive_s > 0 ? client_fd(c) : -1;
    if (fd < 0) return;
    int on = 1, idle = sv->o.keepalive_s, interval = KEEPALIVE_INTERVAL, probes = KEEPALIVE_PROBES;
    unsigned user_timeout_ms = (unsigned)(idle + interval * probes) * 1000u;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

struct MHD_Daemon *http_start(struct server *sv, struct wren_err *e) {
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;
    if (inet_pton(AF_INET, sv->o.host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)sv->o.port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, sv->o.host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)sv->o.port);
        sl = sizeof *a6;
        flags |= MHD_USE_IPv6;
    } else {
        wren_errf(e, "--host: '%s' is not an IPv4 or IPv6 address", sv->o.host);
        return NULL;
    }
    (void)sl;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)sv->o.port, NULL, NULL, handle, sv, MHD_OPTION_SOCK_ADDR, &ss,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)sv->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)sv->o.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, completed, sv,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, sv, MHD_OPTION_END);
    if (!d)
        wren_errf(e, "cannot listen on %s port %d (in use, or not allowed?)", sv->o.host,
                  sv->o.port);
    return d;
}

int http_port(struct MHD_Daemon *d) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}
