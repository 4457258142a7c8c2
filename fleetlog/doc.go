// Package fleetlog is the fleet's log of logs: a Merkle log, kept in etcd,
// whose leaves are the nodes' signed ledger checkpoints, so that one fleet
// checkpoint commits to every node's ledger and no node can show one
// auditor a history it hides from another.
//
// Each node posts its latest signed checkpoint (Log.Post) with the etcd
// revision of the last fleet grant its ledger records. The post becomes
// one leaf (Leaf, leaf.go), hashed as RFC 6962 (golang.org/x/mod/sumdb/tlog,
// as the ledger hashes its events). The fleet checkpoint (Checkpoint) is a
// C2SP checkpoint body, origin, size and base64 root, with no signature of
// its own: each node cosigns it (Log.Cosign) in the C2SP cosignature/v1
// format the witness package reads, with its ledger's key.
//
// Keys, under the Log's prefix (DefaultPrefix):
//
//	head                 {"size":n,"root":"<base64>"}: the fleet log's tree
//	leaf/<index>         the leaf's bytes (index: 20 decimal digits)
//	hash/<index>         a tlog stored hash (the storage index, 20 digits)
//	node/<name>          {"size","root","leaf"}: the node's last accepted checkpoint
//	key/<name>           the node's note verifier key, set by its first post
//	cosig/<size>/<name>  the node's cosignature line of the checkpoint at size
//
// Runs (runs.go) is the fleet's directory of fleet runs, beside the log:
// a fleet run's id, name and creating node (run/<id>, written once), the
// nodes holding a part of it (part/<id>/<node>), and each node's API
// address (peer/<node>), under DefaultRunsPrefix.
//
// # Invariants
//
//   - Append-only. A post writes its leaf, the stored hashes it completes,
//     the new head and the node's state in one etcd transaction that holds
//     only if head and node/<name> are at the revisions the post read
//     (compare-and-swap), retried on conflict. So any node continues the
//     same log after another fails, and no leaf or hash is ever rewritten.
//   - A node's checkpoints only move forward. A post of a checkpoint the
//     node's key does not sign is ErrBadCheckpoint; one of the size of the
//     node's last accepted checkpoint with another root is ErrFork; one of
//     a smaller size is ErrRollback; one of a larger size whose consistency
//     proof (Post.Prove) does not lead from the last is ErrInconsistent.
//     Each names the node and both checkpoints. A node's key is the one of
//     its first post; another is ErrKeyMismatch.
//   - A node cosigns a fleet checkpoint only if its tree is consistent with
//     the last one that node cosigned, checked from the stored hashes.
//
// # Caveats
//
//   - A node's last cosigned tree is kept in the Log value, not in etcd: a
//     restarted node trusts the log it finds, as a witness that lost its
//     state would.
//   - Every post is one leaf; a node that posts each commit group's
//     checkpoint grows the log with its ledger's commit rate. Callers post
//     at a pace of their own (a few a second is plenty).
package fleetlog
