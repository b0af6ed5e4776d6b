"""Decoupled BLS responses read without waiting inside Triton's response iterator: the callee's
side (`callee.py`, the decoder), the caller's (`caller.py`, the orchestrators), what both agree on
(`protocol.py`), and the decoder's audio past the server (`audio_channel.py`).

Triton 2.51's Python backend (python_backend r24.10) has two faults on the path where a thread
waits in a decoupled BLS response iterator, both reproduced by `benchmarks/bls_stress.py`
(benchmarks/results.md, "Twenty-fifth session"):

- a deadlock: a reader woken in `ResponseIterator::Next` holds the iterator's mutex while it
  takes the GIL back; the stub thread that delivers responses (`ProcessBLSResponseDecoupled`)
  holds the iterator map's mutex while it waits for that iterator's; a thread starting a
  decoupled call (`GetResponseIterator`) holds the GIL while it waits for the map's. The
  process stops, and so does the callee's `send` (the server waits for this process to take
  each response): for the decoder, every stream.
- a crash: a finished iterator whose last reference is the stub's map is freed by the stub
  thread that empties the map, without the GIL.

So here no thread waits in an iterator. The callee says how many responses it has sent:

- callee (`callee.py`): `counting_sender` wraps a request's response sender. After each `send`
  returns, the server has handed that response to the caller's iterator (the send waits for it, through
  `SendBLSDecoupledResponse`, as long as the callee has no response delegator: no dynamic
  batching with `preserve_ordering`, no response cache). It then sends the running count to
  the caller's socket (`Notifier`: Unix datagrams, never blocking; retried while it is full).
  Nothing is sent to a caller whose process has died (the pid in its inbox's name): that send
  would wait for good; the call reads as cancelled instead.
- caller (`caller.py`): one `Inbox` per process, a datagram socket in the server's private run
  directory read on the event loop. A `ResponseStream` calls `next()` only as far as it was told, so
  `next()` finds its response buffered. (The first response is buffered when the call returns
  its iterator; its count may come before that.) A first response with an error and no count
  is the server's own (a refused request, final) unless its count comes within
  `ERROR_GRACE_S`; the server's errors on a counted response (no memory for an output) follow
  the counts like any response. A finished iterator is kept `GRAVE_S` before it is let go of
  on the event loop, past the stub's removal of its own reference, so that the last
  reference, and the free, is ours.

The inbox also offers each call its process's audio channel (audio_channel.py). A callee that
takes it (the decoder) sends the call's audio there as frames, which the stream queues beside the
responses (`audio_channel.Chunk`, `.Ended`); the call's responses are then only its first and its
final one. Its frames are written before its final response is sent, so the stream reads the
channel before it takes a final response, and a call that said so (`Opened`) is never handed to a
waiting thread for want of counts.

Errors after a call's first response travel as data. The stub loses the call an error response
belongs to when it comes through the server's callback (every response after the first): it
never reaches the call's iterator, and a final one leaves `next()` waiting for ever. So the
callee's sender (`CountingSender`, or `CarryingSender` for a call nobody counts) sends such an
error as a response with the message in its `ERROR` output (the callee declares it, the caller
asks for it), and the caller turns it back into an error response.

A call that gets no count for `GRACE_S` after it returned (its callee does not count), or whose
counts stop for `FALLBACK_S` while it is open, is read by a thread that waits in the iterator
(Triton's own way): logged, and it is what the orchestrator's metric `voxcpm_decoder_calls_read_total`
counts as "waiting".
"""

