package outbox

import "context"

// RelayBatchForTest runs one relay transaction, as Run does in its loop.
func (r *Relay) RelayBatchForTest(ctx context.Context) Batch { return r.relayBatch(ctx) }

// SetCleanupBatchForTest makes cleanup statements delete n rows at most,
// so a test sees several of them without 10,000 rows.
func (r *Relay) SetCleanupBatchForTest(n int) { r.cleanupBatch = n }
