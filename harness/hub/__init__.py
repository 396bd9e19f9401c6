"""Models from a Hugging Face hub: `bmoe pull`, `-hf` and campaigns' `model: {hf: ...}`.

Built on huggingface_hub: its cache (HF_HOME, HF_HUB_CACHE: a model already downloaded, by this or by any tool using
that cache, llama.cpp's -hf included, is reused), its token (HF_TOKEN or `huggingface-cli login`), HF_ENDPOINT and
offline mode (HF_HUB_OFFLINE=1). What bmoe adds: the quant picked by name as llama.cpp's -hf picks it, every shard of
a split model under one progress bar, a download that resumes after a dropped connection or a Ctrl-C, each file's
sha256 checked against the hub's LFS metadata before use, the free space checked before the first byte, and every
failure as one line.

    spec      what the user typed (org/repo[:QUANT|/file.gguf]), names checked, the quant picked (no network)
    remote    the hub's answers: the repo's files with their sizes and hashes, errors turned into one line
    fetch     one file into the cache, resumable, its hash checked
    cache     the cache's layout: a commit's files, for offline mode and what is already there
    pull      the whole: resolve, check space, fetch every shard, return the local files and where they came from
    command   `bmoe pull` and the `-hf` rewrite of an engine command line

May import: harness.errors, harness.formats, huggingface_hub. Nothing of the engine or the campaigns (both use it).
"""
