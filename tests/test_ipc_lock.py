"""serving.ipc_lock.IPCLock: the stub-call lock of a model process's own threads (triton_io.IPC_LOCK):
response sends shared among the decoder's audio senders, every other call exclusive."""

import threading
import time

from voxcpm_triton.serving.ipc_lock import IPCLock


def _in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_shared_holders_hold_it_together():
    lock = IPCLock()
    together = threading.Barrier(3, timeout=10)

    def send():
        with lock.shared():
            together.wait()  # all three inside at once, or it breaks

    threads = [_in_thread(send) for _ in range(3)]
    for t in threads:
        t.join(20)
    assert not together.broken and not any(t.is_alive() for t in threads)


def test_exclusive_waits_for_shared_holders_and_goes_before_new_ones():
    lock = IPCLock()
    order, sending, let_go = [], threading.Event(), threading.Event()

    def send(name, hold=False):
        with lock.shared():
            order.append(name)
            if hold:
                sending.set()
                assert let_go.wait(10)

    def update():
        with lock:
            order.append("exclusive")

    first = _in_thread(lambda: send("first send", hold=True))
    assert sending.wait(10)
    exclusive = _in_thread(update)
    while not lock._exclusive_waiting:  # the exclusive caller waits for the send in flight
        time.sleep(0.001)
    second = _in_thread(lambda: send("second send"))
    time.sleep(0.1)
    assert order == ["first send"]  # neither the exclusive call nor a new send while it waits
    let_go.set()
    for t in (first, exclusive, second):
        t.join(10)
    assert order == ["first send", "exclusive", "second send"]


def test_exclusive_is_reentrant_times_out_and_may_take_it_shared():
    lock = IPCLock()
    with lock:
        with lock:  # re-entrant
            with lock.shared():  # an exclusive holder's shared call: a no-op
                pass
        got = []
        t = _in_thread(lambda: got.append(lock.acquire(timeout=0.05)))
        t.join(10)
        assert got == [False]  # held by this thread: another one times out
    assert lock.acquire(timeout=0) and lock._owner is not None
    lock.release()
    other = []
    _in_thread(lambda: other.append(lock.acquire(timeout=1) and (lock.release() or True))).join(10)
    assert other == [True]  # let go of entirely


def test_release_by_another_thread_is_refused():
    lock = IPCLock()
    errors = []
    with lock:
        def wrong():
            try:
                lock.release()
            except RuntimeError as e:
                errors.append(str(e))

        _in_thread(wrong).join(10)
    assert errors and "does not hold" in errors[0]
