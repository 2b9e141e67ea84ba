"""What an NVIDIA GPU model's generation asks of its driver, read from the model's name."""

from __future__ import annotations

import re

# Blackwell (B200, B300, GB200, GB300) and Grace Hopper (GH200) run only the open kernel modules:
# "Blackwell and later are only supported by the open kernel modules" (NVIDIA driver README,
# "Open Linux Kernel Modules", http://http.download.nvidia.com/XFree86/Linux-x86_64/560.28.03/README/kernel_open.html);
# "For cutting-edge platforms such as NVIDIA Grace Hopper or NVIDIA Blackwell, you must use the
# open-source GPU kernel modules. The proprietary drivers are unsupported on these platforms."
# (https://developer.nvidia.com/blog/nvidia-transitions-fully-towards-open-source-gpu-kernel-modules/).
_OPEN_ONLY = re.compile(r"^(G?B[0-9]{3}|GH[0-9]{3}|BLACKWELL)$")


def open_modules_only(model: str) -> bool:
    """Whether ``model`` (``B300``, ``NVIDIA GB300``, ``GH200``) runs only NVIDIA's open kernel modules."""
    return any(_OPEN_ONLY.match(w) for w in model.upper().replace("NVIDIA", " ").split())
