# Declarations for the fan-out core (see fanout.pyx).
from natsjs._core.parser cimport ProtoParser
from natsjs._core.sublist cimport Sublist, SublistResult, Subscription


cdef class Sink:
    # An internal subscriber in C: Conn.deliver hands it the message's bytes in place
    # (no Python objects) when a subscription's callback is a Sink.
    cdef int absorb(self, Conn producer, const unsigned char* subj, Py_ssize_t slen,
                    const unsigned char* reply, Py_ssize_t rlen, const unsigned char* msg,
                    Py_ssize_t hdr, Py_ssize_t size) except -1


cdef class WithProducer:
    # An internal subscriber's callback that is also given the publishing connection.
    cdef public object fn


cdef class Conn(ProtoParser):
    cdef public bytearray out          # outbound bytes not yet written to the socket
    cdef public Py_ssize_t max_pending
    cdef public bint pending           # already in some reader's pcd list
    cdef public bint headers
    cdef public object conn            # the Python connection object (rare events)
    cdef public long long in_msgs
    cdef public long long in_bytes
    cdef public long long out_msgs
    cdef public long long out_bytes
    cdef public list pcd               # connections written to in this read batch
    cdef public object stalled         # a Conn over its stall threshold, or None
    cdef public bint is_route
    cdef public object on_trace_out    # (-V) on_trace_out(frame_line, payload)
    # Subscribe-deny check at delivery (a wildcard subscription may cover denied
    # subjects): deliver_filter(subject) -> bool, None when the client has no deny list.
    cdef public object deliver_filter
    cdef public bint echo
    cdef unsigned long long rng
    # JetStream deliveries are matched on one subject and shown with another (the
    # stored message's): set for the duration of one publish (publish_deliver, or a
    # routed ``$JS.ACK...@subject`` reply).
    cdef const unsigned char* dsubj
    cdef Py_ssize_t dsubj_len
    # The last subject this connection published (or routed) and what it matched: a
    # run of messages to one subject is matched once (``match_cached``).
    cdef bytes last_subject
    cdef SublistResult last_result
    cdef Sublist last_sublist          # the sublist last_result came from
    cdef unsigned long long last_gen
    cdef SublistResult match_cached(self, Sublist sl, const unsigned char* subj,
                                    Py_ssize_t slen)
    cdef int deliver(self, Subscription sub, const unsigned char* msg) except -1
    cdef int deliver_to_group(self, list group, const unsigned char* msg,
                              bint to_routes) except -1
    cdef int route_queue(self, Conn route, bytes queue) except -1
    cdef Py_ssize_t pick(self, Py_ssize_t n)
    cdef int write_msg(self, Subscription sub,
                       const unsigned char* subj, Py_ssize_t slen,
                       const unsigned char* reply, Py_ssize_t rlen,
                       const unsigned char* msg, Py_ssize_t hdr,
                       Py_ssize_t size) except -1
    cdef int queued(self, Conn producer) except -1
    cpdef send_msg(self, Subscription sub, bytes subject, bytes reply, Py_ssize_t hdr, bytes msg)


cdef class ClientCore(Conn):
    cdef public Sublist sublist
    cdef public bytes account_name
    cdef public bint to_routes          # False: deliver to this server's subscribers only
    cdef list rtargets                 # routes this message goes to
    cdef list rqueues                  # per route: queue names picked on that route
    cdef public bint verbose
    cdef public bint pedantic
    cdef public bint no_responders
    # Permissions, None for the common unrestricted client: pub_check(subject) -> bool,
    # on_reply(reply) records reply subjects this client may answer (allow_responses).
    cdef public object pub_check
    cdef public object on_reply
    cdef bytes route_reply             # reply + "@" + shown subject, for routes
    # The connection's subscriptions, sid -> Subscription.  SUB and UNSUB are handled
    # here while ``fast_subs`` (no subscribe permissions, no tracing, no limit
    # reached): the interest changes of a read batch go to Python in one call,
    # on_interest(subs, delta), where the server counts them and tells the routes.
    cdef public dict subs
    cdef public bint fast_subs
    # Subscribe permissions, None when the client has none: sub_check(subject, queue)
    # -> bool; a refusal goes to Python, which reports it.
    cdef public object sub_check
    cdef public object on_interest
    cdef public Py_ssize_t max_subs    # 0: no limit
    cdef list ipending                 # subscriptions added (idelta 1) or removed (-1)
    cdef int idelta
    cdef SublistResult lookup(self, const unsigned char* subj, Py_ssize_t slen)
    cdef int no_responders_reply(self) except -1
    cdef Py_ssize_t route_target(self, Conn route) except -1
    cdef int send_to_routes(self, const unsigned char* msg) except -1
    cdef int _process_sub(self, const unsigned char* arg, Py_ssize_t n) except -1
    cdef int _process_unsub(self, const unsigned char* arg, Py_ssize_t n) except -1
    cdef int _ok(self) except -1
    cdef int note_interest(self, Subscription sub, int delta) except -1
    cpdef flush_interest(self)
    cpdef bint unsubscribe(self, Subscription sub) except -1
    cpdef Subscription add_sub(self, bytes subject, bytes queue, bytes sid)
    cpdef list drop_all(self, Sublist sublist, bint keep=*)


cdef class PeerSubs:
    # The subscriptions one cluster peer holds here, over all its connections, and
    # how many it may (--cluster_max_subs).
    cdef public Py_ssize_t count
    cdef public Py_ssize_t limit


cdef class RouteCore(Conn):
    cdef public dict sublists          # account name (bytes) -> Sublist
    cdef public bytes pinned_account   # set on a pinned-account route
    # The peer's interest that came on this connection: "<account> <subject>[ <queue>]"
    # (nats-server's key, and the subscription's sid) -> Subscription.  RS+ and RS-
    # are handled here while ``interest_ok`` (registered, no cluster permissions to
    # check, not being retired) and the peer is under its limit.
    cdef public dict remote_subs
    cdef public bint interest_ok
    cdef public PeerSubs peer_subs
    # The server at the other end (the route itself until registered): a message goes
    # to each peer once, even while its interest sits on two of its connections.
    cdef public object peer
    # The last message's account and its sublist (the subject: Conn.match_cached).
    cdef bytes last_acc
    cdef Sublist last_acc_sl
    cdef int write_rmsg(self, const unsigned char* acc, Py_ssize_t alen,
                        const unsigned char* subj, Py_ssize_t slen,
                        const unsigned char* reply, Py_ssize_t rlen,
                        const unsigned char* queues, Py_ssize_t qlen,
                        const unsigned char* msg, Py_ssize_t hdr,
                        Py_ssize_t size) except -1
    cpdef send_rmsg(self, bytes account, bytes subject, bytes reply, bytes queues,
                    Py_ssize_t hdr, bytes msg)
    cdef int _remap_js_reply(self) except -1
    cdef int _remote_sub(self, const unsigned char* arg, Py_ssize_t n) except -1
    cdef int _remote_unsub(self, const unsigned char* arg, Py_ssize_t n) except -1
    cdef bytes _interest_key(self, const unsigned char* arg, Py_ssize_t* starts,
                             Py_ssize_t* lens, Py_ssize_t first, Py_ssize_t count)
    cpdef Subscription add_remote(self, Sublist sl, bytes key, bytes subject, bytes queue,
                                  int weight)
    cpdef bint drop_remote(self, bytes key) except -1
