package staging

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// LastGoodAt is LastGood with the time the payload was fetched (when the
// item that staged it finished): what the proxy route tells a client about
// a stale copy it serves.
func (s *Store) LastGoodAt(requestKey string) (sum string, at time.Time, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		sum, at, ok = decodeLastGood(tx.Bucket(bucketLastGood).Get([]byte(requestKey)))
		return nil
	})
	return sum, at, ok, err
}
