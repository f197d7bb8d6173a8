"""Threaded CPython workload for the LD_PRELOAD tests: builds objects in producer threads, frees them in consumers."""
import hashlib
import queue
import sys
import threading

ROUNDS = 400     # batches per producer
BATCH = 250      # objects per batch


def make_batch(worker: int, rnd: int) -> list:
    """A deterministic batch of mixed objects: strings, bytes, dicts, lists, tuples of varied sizes."""
    out = []
    for i in range(BATCH):
        n = (worker * 7919 + rnd * 104729 + i * 31) % 997
        out.append({"w": worker, "r": rnd, "i": i, "s": "x" * (n % 300), "b": bytes([n % 256]) * (n % 700),
                    "l": list(range(n % 40)), "t": (n, str(n), float(n))})
    return out


def digest_batch(batch: list) -> bytes:
    h = hashlib.sha256()
    for o in batch:
        h.update(f"{o['w']}:{o['r']}:{o['i']}:{len(o['s'])}:{sum(o['l'])}:{o['t'][1]}".encode())
        h.update(o["b"])
    return h.digest()


def expected_checksum(producers: int) -> str:
    """The checksum computed serially: one digest per (producer, round), combined in order."""
    h = hashlib.sha256()
    for w in range(producers):
        for r in range(ROUNDS):
            h.update(digest_batch(make_batch(w, r)))
    return h.hexdigest()


def threaded_checksum(producers: int, consumers: int) -> str:
    """The same checksum, with batches built in producer threads and digested (then freed) in consumer threads."""
    q: queue.Queue = queue.Queue(maxsize=64)
    results: dict = {}
    lock = threading.Lock()

    def produce(w: int) -> None:
        for r in range(ROUNDS):
            q.put((w, r, make_batch(w, r)))

    def consume() -> None:
        while True:
            item = q.get()
            if item is None:
                return
            w, r, batch = item
            d = digest_batch(batch)
            del batch, item  # the batch dies here, in a thread other than the one that built it
            with lock:
                results[(w, r)] = d

    cons = [threading.Thread(target=consume) for _ in range(consumers)]
    prods = [threading.Thread(target=produce, args=(w,)) for w in range(producers)]
    for t in cons + prods:
        t.start()
    for t in prods:
        t.join()
    for _ in cons:
        q.put(None)
    for t in cons:
        t.join()
    h = hashlib.sha256()
    for w in range(producers):
        for r in range(ROUNDS):
            h.update(results[(w, r)])
    return h.hexdigest()


if __name__ == "__main__":
    print("checksum", threaded_checksum(int(sys.argv[1]), int(sys.argv[2])))
