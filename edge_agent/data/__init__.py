"""Datasets: the container, file readers/writers, an RCV1-like generator and shard splitting.

The public names, gathered from the modules that hold them:

* :class:`Dataset` (:mod:`edge_agent.data.dataset`) pairs a design matrix (dense float64 array
  or :class:`~edge_agent.data.sparse.CSRMatrix`) with a label vector.
* Readers for LIBSVM/SVMlight text, ``.npz`` and CSV, and :func:`load_dataset`, which
  picks one from the file extension (:mod:`edge_agent.data.datafiles`).
* :func:`make_rcv1_like` and :func:`split_shards` (:mod:`edge_agent.data.datagen`).

Label convention: binary labels are ``-1.0``/``+1.0`` (``{0, 1}`` files are
mapped on read); multiclass labels are kept as the integers the file holds
(stored as float64). Every random choice takes an explicit numpy Generator.
None of these modules imports :mod:`edge_agent.numerics.models` (models import us).
"""

from __future__ import annotations

from edge_agent.data.datafiles import (
    LIBSVM_SUFFIXES,
    READERS,
    load_dataset,
    read_csv,
    read_libsvm,
    read_npz,
    write_libsvm,
    write_npz,
)
from edge_agent.data.datagen import SHARDINGS, make_rcv1_like, split_shards
from edge_agent.data.dataset import Dataset

__all__ = [
    "LIBSVM_SUFFIXES",
    "READERS",
    "SHARDINGS",
    "Dataset",
    "load_dataset",
    "make_rcv1_like",
    "read_csv",
    "read_libsvm",
    "read_npz",
    "split_shards",
    "write_libsvm",
    "write_npz",
]
