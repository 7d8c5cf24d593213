package diagnose

// storageUnjudged says why the window's storage reads are not judged
// (checklist item 6), "" when they are.
func (w *window) storageUnjudged(cfg Config) string {
	switch {
	case !cfg.TraceStorageReads:
		return "storage reads are traced with --trace-storage-reads (off by default: its program runs at every system call's exit on the host)"
	case w.storageErr != nil:
		return "storage tracer: " + w.storageErr.Error()
	case len(w.storage) == 0:
		return "no traced process read from a block device in the window (io_uring and GPUDirect Storage reads are not seen)"
	}
	return ""
}
