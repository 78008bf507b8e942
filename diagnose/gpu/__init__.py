"""`grpolab diagnose gpu` and the GPU sampler of `grpolab train`: NVIDIA GPUs read through NVML.

The room: the sampler writing RUN_DIR/gpu.jsonl (sampler.py), the command (command.py), the NVML
readings (nvml.py; pynvml is imported only when a session opens, torch never) and the pure throttle
and clean-step rules (throttle.py).
"""

from grpolab.diagnose.gpu.command import add_gpu_arguments, format_reading, run_gpu_command
from grpolab.diagnose.gpu.nvml import NoNvidiaDriver, NvmlSession, read_gpus
from grpolab.diagnose.gpu.sampler import GPU_FILE, GpuSampler, start_run_sampler
from grpolab.diagnose.gpu.throttle import clean_step_mask, sample_is_throttled, throttle_times

__all__ = [
    "GPU_FILE",
    "GpuSampler",
    "NoNvidiaDriver",
    "NvmlSession",
    "add_gpu_arguments",
    "clean_step_mask",
    "format_reading",
    "read_gpus",
    "run_gpu_command",
    "sample_is_throttled",
    "start_run_sampler",
    "throttle_times",
]
