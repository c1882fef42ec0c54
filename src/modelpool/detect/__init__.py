"""What a model is, from its files: the backend that runs it, the tasks it serves, the
options it needs and the facts worth showing (architecture, context, quantisation).

Detection looks only at file names, small config files and the head of a GGUF file,
through a `FileView`: `LocalView` for a file or folder on disk, the hub's `HubView` for a
repo. It imports no engine and no config: `config` calls it to fill in what an entry
leaves out, and `modelpool show` to print what it found."""

from modelpool.detect.detector import LOOKED_FOR, detect
from modelpool.detect.result import Detected
from modelpool.detect.view import FileView, LocalView

__all__ = ["LOOKED_FOR", "Detected", "FileView", "LocalView", "detect"]
