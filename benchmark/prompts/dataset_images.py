"""A dataset's image column as each prompt's source image (``metadata["source_image"]``, ``flowzoo.source_images``),
for instruction-editing models read from the ``dataset`` prompt source (``benchmark/prompts/local_datasets.py``).

A cell of the column is one of:

* an image (``datasets``' ``Image`` feature decodes to a PIL image): converted to RGB and kept as a float tensor
  [3, H, W] in [0, 1];
* an array (numpy, nested lists, a tensor) of shape [C, H, W] or [H, W, C] with C 1 or 3 (one channel repeated to
  three; a first dimension of 1 or 3 is read as channels first): integers are read as 0-255 and divided by 255,
  floats must already lie in [0, 1]; kept as a float tensor [3, H, W];
* a path string: relative paths are resolved against the dataset's folder (the folder itself, or a data file's
  folder); the file must be an image PIL can read, and the absolute path is kept (the edit models read it lazily).

Tensors are held in memory for the whole run (float32, 12 bytes a pixel): a large image set is better given as a
path column. A cell that is none of these, or missing, is one line naming the column and the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowzoo.errors import ConfigError
from flowzoo.source_images import check_image_file


def source_images(values: list[Any], root: Path, where: str, column: str) -> list[Any]:
    """Each row's source image (a float [3, H, W] tensor in [0, 1], or an absolute image path) from the column's
    values; ``root`` is the dataset's path, against whose folder relative paths resolve."""
    folder = root if root.is_dir() else root.parent
    return [_one(value, folder, f"{where}: row {i} of column {column!r}") for i, value in enumerate(values)]


def _one(value: Any, folder: Path, where: str) -> Any:
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = (path if path.is_absolute() else folder / path).resolve()
        check_image_file(path, where)
        return str(path)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - PIL comes with the image models' dependencies
        Image = None
    if Image is not None and isinstance(value, Image.Image):
        import numpy as np
        import torch

        return torch.from_numpy(np.asarray(value.convert("RGB")).copy()).permute(2, 0, 1).float() / 255.0
    if value is None:
        raise ConfigError(f"{where}: no source image (got None)")
    return _array(value, where)


def _array(value: Any, where: str):
    """An array cell as a float [3, H, W] tensor in [0, 1]."""
    import numpy as np
    import torch

    try:
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: not an image, an array or a path ({type(value).__name__}: {err})") from None
    if array.dtype == object or array.ndim != 3 or not (np.issubdtype(array.dtype, np.integer)
                                                         or np.issubdtype(array.dtype, np.floating)):
        raise ConfigError(f"{where}: an array source image must be numbers of shape [C, H, W] or [H, W, C] with C 1 "
                          f"or 3, got {array.dtype} {array.shape}")
    if array.shape[0] in (1, 3):
        tensor = torch.from_numpy(array.copy())
    elif array.shape[-1] in (1, 3):
        tensor = torch.from_numpy(array.copy()).permute(2, 0, 1)
    else:
        raise ConfigError(f"{where}: an array source image must have 1 or 3 channels first or last, got shape "
                          f"{array.shape}")
    if np.issubdtype(array.dtype, np.integer):
        if tensor.numel() and (tensor.min() < 0 or tensor.max() > 255):
            raise ConfigError(f"{where}: integer pixel values must lie in 0-255, got "
                              f"[{int(tensor.min())}, {int(tensor.max())}]")
        tensor = tensor.float() / 255.0
    else:
        tensor = tensor.float()
        if tensor.numel() and not (torch.isfinite(tensor).all() and tensor.min() >= 0 and tensor.max() <= 1):
            raise ConfigError(f"{where}: float pixel values must lie in [0, 1], got "
                              f"[{float(tensor.min()):.3g}, {float(tensor.max()):.3g}]")
    return tensor.expand(3, -1, -1).contiguous() if tensor.shape[0] == 1 else tensor.contiguous()
