"""A vLLM general plugin (entry point `vllm.general_plugins`) that ties vLLM's engine process to
the worker that started it.

vLLM runs its engine core in a child process that does not watch its parent: a worker killed with
SIGKILL would leave it running, holding its memory and CPU. vLLM loads general plugins in every
process it starts; in the engine core, whose parent is the worker (`KVMESH_VLLM_WORKER_PID`, set
by the worker before it starts vLLM), this one asks the kernel to SIGKILL the process when the
worker dies. vLLM's own executor workers already exit when the engine core does. In any other
process (vLLM used without the kvmesh worker) it does nothing.
"""
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
WORKER_PID_ENV = "KVMESH_VLLM_WORKER_PID"


def exit_with_worker() -> None:
    worker = os.environ.get(WORKER_PID_ENV)
    if not worker or not worker.isdigit() or int(worker) != os.getppid():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    # The worker may have died before the request: the process was then re-parented.
    if os.getppid() != int(worker):
        os._exit(1)
