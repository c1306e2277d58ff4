"""The extraction's disk side: a few threads create and fill the files while the next headers are
parsed; a file is never created through a symlink, a same-named one from earlier in the tar is
replaced as tar does, and a failed write is named (a full disk, an unwritable WORKDIR)."""

from __future__ import annotations

import os
import queue
import stat
import threading
from collections.abc import Callable

from ..errors import UnsafeArchiveError
from ..foreign import Area, Where, agent_error

_PENDING_BYTES = 32 << 20  # file contents waiting for a writer thread: the memory this may take
WRITERS = max(1, min(4, os.cpu_count() or 1))

# The fix for a tar whose layout is refused, here and in the member checks of ``extract``.
REPACK = "repack the dataset with relative paths inside one folder (tar -C DIR -cf data.tar .)"


def replacing(path: str, relative: str, make: Callable[[], int]) -> int:
    """Run ``make``; a file or link of the same name from earlier in the tar is replaced, as tar does."""
    try:
        return make()
    except FileExistsError:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeArchiveError(
                f"the tar holds {relative!r} both as a folder and as a file: refused", REPACK
            ) from None
        os.unlink(path)
        return make()


_Job = tuple[str, str, int, bytes]  # path, name in the archive, mode, contents


def create_file(path: str, relative: str, mode: int) -> int:
    """A new file (never through a symlink), replacing one of the same name from earlier in the tar."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return replacing(path, relative, lambda: os.open(path, flags, mode))


class Writers:
    """A few threads that create and fill the files (os calls release the GIL), so the kernel's
    work runs on every core while the main thread parses the next headers. A path always goes to
    the same thread, so two members of the same name are written in tar order. The first error
    is raised in the main thread at its next call."""

    def __init__(self, count: int) -> None:
        # None ends a thread
        self.queues: list[queue.SimpleQueue[_Job | None]] = [queue.SimpleQueue() for _ in range(count)]
        self.pending = 0  # bytes submitted and not yet written
        self.jobs = 0
        self.error: BaseException | None = None
        self.cancelled = False
        self.done = threading.Condition()
        self.threads = [
            threading.Thread(target=self._work, args=(jobs,), name=f"extract-writer-{index}", daemon=True)
            for index, jobs in enumerate(self.queues)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, path: str, relative: str, mode: int, data: bytes) -> None:
        with self.done:
            while self.pending > _PENDING_BYTES and self.error is None:
                self.done.wait()
            self._raise()
            self.pending += len(data)
            self.jobs += 1
        self.queues[hash(path) % len(self.queues)].put((path, relative, mode, data))

    def flush(self) -> None:
        with self.done:
            while self.jobs and self.error is None:
                self.done.wait()
            self._raise()

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        for jobs in self.queues:
            jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _work(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            path, relative, mode, data = job
            try:
                if self.error is None and not self.cancelled:  # after a failure the rest is dropped
                    fd = create_file(path, relative, mode)
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view) :]
                    finally:
                        os.close(fd)
            except OSError as error:
                self._fail(disk_error(error, relative))
            except Exception as error:
                self._fail(error)
            with self.done:
                self.pending -= len(data)
                self.jobs -= 1
                self.done.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self.done:
            if self.error is None:
                self.error = error


def disk_error(error: OSError, relative: str) -> Exception:
    where = Where(Area.DATASET_WRITE, doing=f"extracting {relative!r}", path=relative)
    return agent_error(error, where) or error
