"""recurscan: linear recurrences fast (Gated DeltaNet, Gated Delta Product, Mamba2 SSD, gated
linear attention, diagonal scans), with a CPU oracle anyone can read."""

__version__ = "0.1.0"
