package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// Role is what a token may do. Roles are ordered; see Allows.
type Role string

// Roles, from least to most privileged.
const (
	RoleAuditor  Role = "auditor"  // read and export
	RoleOperator Role = "operator" // auditor, plus runs and acknowledgements
	RoleAdmin    Role = "admin"    // operator, plus sources and tokens
)

// rank orders roles; an unknown role ranks below every known one.
func (r Role) rank() int {
	switch r {
	case RoleAuditor:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// Valid reports whether r is one of the known roles.
func (r Role) Valid() bool { return r.rank() > 0 }

// Allows reports whether a token with role r may do what needs role min.
func (r Role) Allows(min Role) bool { return r.Valid() && r.rank() >= min.rank() }

// SecretPrefix starts every secret the store mints, so that secret scanners
// (and people) can recognise a leaked auditd token.
const SecretPrefix = "adt_"

// MinSecretLen is the shortest secret the store accepts from outside
// (AUDITD_BOOTSTRAP_TOKEN); minted secrets are longer.
const MinSecretLen = 24

// Bucket names. Nothing outside this package reads or writes them.
const (
	bucketTokens = "auth.tokens" // id -> JSON record
	bucketHashes = "auth.hashes" // SHA-256 of the secret -> id
)

// Token is what the store knows about one API token, minus its secret.
type Token struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Role      Role      `json:"role"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
}

// Revoked reports whether the token has been revoked.
func (t Token) Revoked() bool { return !t.RevokedAt.IsZero() }

// Principal names the token's holder in ledger events and logs.
func (t Token) Principal() string { return t.Name + " (" + t.ID + ")" }

// record is a Token as stored, with the hash of its secret.
type record struct {
	Token
	Hash []byte `json:"hash"`
}

// Store keeps tokens in their own bbolt buckets. It is safe for concurrent use.
type Store struct {
	db     *bolt.DB
	ledger auditd.Appender

	// Now stamps CreatedAt and RevokedAt. Default: time.Now.
	Now func() time.Time
	// Rand supplies secrets and token ids. Default: crypto/rand.Reader.
	// Set it before the first Create.
	Rand io.Reader

	// idsOnce makes ids, the monotonic entropy that keeps ids minted in
	// the same millisecond in the order they were minted, so that List
	// (which sorts by id) lists tokens in the order they were created.
	idsOnce sync.Once
	ids     *ulid.LockedMonotonicReader

	// known holds what Authenticate read of the tokens it was shown since
	// the last change to any token: a request's token check is then a map
	// lookup, not a bbolt read and a JSON decode. Every write moves gen on
	// once it has committed (update), which retires every entry: a token
	// is refused to every request that reaches Authenticate after Revoke
	// has returned (as without it, one racing the revoke may pass). Only tokens
	// that exist are kept, so unknown secrets cannot grow it. The Store
	// must be the only writer of its buckets (bbolt's file lock keeps
	// other processes out; serve makes one Store).
	gen   atomic.Uint64
	known sync.Map // [sha256.Size]byte -> knownToken
}

// knownToken is a token as Authenticate read it while gen was gen.
type knownToken struct {
	gen uint64
	tok Token
}

// update runs fn in a read-write transaction and retires what
// Authenticate knows.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	defer s.gen.Add(1)
	return s.db.Update(fn)
}

// NewStore returns a Store on db, creating its buckets. Every change is
// recorded on ledger as a token.changed event.
func NewStore(db *bolt.DB, ledger auditd.Appender) (*Store, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{bucketTokens, bucketHashes} {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Store{db: db, ledger: ledger, Now: time.Now, Rand: rand.Reader}, nil
}

// Create mints a token for name with role, on behalf of principal by, and
// returns it with its secret. The secret is not kept: this is the only time
// anyone sees it.
func (s *Store) Create(ctx context.Context, name string, role Role, by string) (Token, string, error) {
	secret, err := s.newSecret()
	if err != nil {
		return Token{}, "", err
	}
	tok, err := s.create(ctx, name, role, by, secret)
	if err != nil {
		return Token{}, "", err
	}
	return tok, secret, nil
}

func (s *Store) newSecret() (string, error) { return NewSecret(s.Rand) }

// NewSecret returns a token secret as the Store mints them: SecretPrefix
// and 32 bytes read from r.
func NewSecret(r io.Reader) (string, error) {
	b := make([]byte, 32)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("read random secret: %w", err)
	}
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

func (s *Store) create(ctx context.Context, name string, role Role, by, secret string) (Token, error) {
	if !role.Valid() {
		return Token{}, &auditd.Error{Code: auditd.EINVALID, Field: "role", Message: "role must be admin, operator or auditor"}
	}
	if name = strings.TrimSpace(name); name == "" {
		return Token{}, &auditd.Error{Code: auditd.EINVALID, Field: "name", Message: "name is required"}
	}
	now := s.Now().UTC()
	s.idsOnce.Do(func() { s.ids = &ulid.LockedMonotonicReader{MonotonicReader: ulid.Monotonic(s.Rand, 0)} })
	id, err := ulid.New(ulid.Timestamp(now), s.ids)
	if err != nil {
		return Token{}, fmt.Errorf("new token id: %w", err)
	}
	sum := sha256.Sum256([]byte(secret))
	rec := record{
		Token: Token{ID: "tok_" + id.String(), Name: name, Role: role, CreatedAt: now, CreatedBy: by},
		Hash:  sum[:],
	}
	err = s.update(func(tx *bolt.Tx) error {
		hashes := tx.Bucket([]byte(bucketHashes))
		if hashes.Get(rec.Hash) != nil {
			return auditd.Errorf(auditd.ECONFLICT, "a token with this secret already exists")
		}
		if err := hashes.Put(rec.Hash, []byte(rec.ID)); err != nil {
			return err
		}
		return putRecord(tx, rec)
	})
	if err != nil {
		return Token{}, fmt.Errorf("store token: %w", err)
	}
	if err := s.record(ctx, "created", rec.Token, by); err != nil {
		if derr := s.delete(rec); derr != nil {
			return Token{}, errors.Join(err, fmt.Errorf("undo token create: %w", derr))
		}
		return Token{}, err
	}
	return rec.Token, nil
}

// delete removes a token entirely; only create uses it, to undo itself.
func (s *Store) delete(rec record) error {
	return s.update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte(bucketHashes)).Delete(rec.Hash); err != nil {
			return err
		}
		return tx.Bucket([]byte(bucketTokens)).Delete([]byte(rec.ID))
	})
}

// Authenticate returns the active token whose secret is secret. Any failure
// (unknown, revoked) is the same EUNAUTHORIZED, so a caller learns nothing
// about which tokens exist.
func (s *Store) Authenticate(secret string) (Token, error) {
	sum := sha256.Sum256([]byte(secret))
	gen := s.gen.Load() // before the read: a write after it retires what is kept
	if v, ok := s.known.Load(sum); ok {
		if k := v.(knownToken); k.gen == gen {
			return active(k.tok)
		}
	}
	var rec record
	var found bool
	err := s.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket([]byte(bucketHashes)).Get(sum[:])
		if id == nil {
			return nil
		}
		v := tx.Bucket([]byte(bucketTokens)).Get(id)
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &rec)
	})
	if err != nil {
		return Token{}, fmt.Errorf("read token: %w", err)
	}
	// The lookup is keyed by the hash, which an attacker cannot steer; the
	// constant-time compare keeps the final check free of timing signal.
	if !found || subtle.ConstantTimeCompare(rec.Hash, sum[:]) != 1 {
		return active(Token{})
	}
	s.known.Store(sum, knownToken{gen: gen, tok: rec.Token})
	return active(rec.Token)
}

// active returns tok if it is an active token (not revoked, not the zero
// Token of an unknown secret), the EUNAUTHORIZED that every failure is
// otherwise.
func active(tok Token) (Token, error) {
	if tok.ID == "" || tok.Revoked() {
		return Token{}, auditd.Errorf(auditd.EUNAUTHORIZED, "Missing, unknown or revoked token.")
	}
	return tok, nil
}

// List returns every token, revoked ones included, oldest first.
func (s *Store) List() ([]Token, error) {
	var toks []Token
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(bucketTokens)).ForEach(func(_, v []byte) error {
			var rec record
			if err := json.Unmarshal(v, &rec); err != nil {
				return err
			}
			toks = append(toks, rec.Token)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	sort.Slice(toks, func(i, j int) bool { return toks[i].ID < toks[j].ID })
	return toks, nil
}

// Revoke revokes token id on behalf of principal by. Revoking a revoked
// token changes nothing and returns changed false. Revoking the last active
// admin token is an ECONFLICT.
func (s *Store) Revoke(ctx context.Context, id, by string) (tok Token, changed bool, err error) {
	var prev record
	err = s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketTokens))
		v := b.Get([]byte(id))
		if v == nil {
			return auditd.Errorf(auditd.ENOTFOUND, "Token not found.")
		}
		if err := json.Unmarshal(v, &prev); err != nil {
			return err
		}
		if prev.Revoked() {
			tok = prev.Token
			return nil
		}
		if prev.Role == RoleAdmin {
			n, err := activeAdmins(b)
			if err != nil {
				return err
			} else if n <= 1 {
				return auditd.Errorf(auditd.ECONFLICT, "This is the last active admin token; create another admin token first.")
			}
		}
		next := prev
		next.RevokedAt, next.RevokedBy = s.Now().UTC(), by
		tok, changed = next.Token, true
		return putRecord(tx, next)
	})
	if err != nil || !changed {
		return tok, false, err
	}
	if err := s.record(ctx, "revoked", tok, by); err != nil {
		if rerr := s.update(func(tx *bolt.Tx) error { return putRecord(tx, prev) }); rerr != nil {
			return Token{}, false, errors.Join(err, fmt.Errorf("undo token revoke: %w", rerr))
		}
		return Token{}, false, err
	}
	return tok, true, nil
}

func activeAdmins(b *bolt.Bucket) (int, error) {
	n := 0
	err := b.ForEach(func(_, v []byte) error {
		var rec record
		if err := json.Unmarshal(v, &rec); err != nil {
			return err
		}
		if rec.Role == RoleAdmin && !rec.Revoked() {
			n++
		}
		return nil
	})
	return n, err
}

// Empty reports whether the store holds no token at all, revoked or not.
func (s *Store) Empty() (bool, error) {
	var empty bool
	err := s.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket([]byte(bucketTokens)).Cursor().First()
		empty = k == nil
		return nil
	})
	return empty, err
}

func putRecord(tx *bolt.Tx, rec record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return tx.Bucket([]byte(bucketTokens)).Put([]byte(rec.ID), v)
}

// record appends the token.changed event for action on tok by principal by.
// The secret and its hash never reach the ledger.
func (s *Store) record(ctx context.Context, action string, tok Token, by string) error {
	var detail bytes.Buffer
	err := json.NewEncoder(&detail).Encode(struct {
		Action string `json:"action"`
		ID     string `json:"token_id"`
		Name   string `json:"name"`
		Role   Role   `json:"role"`
	}{action, tok.ID, tok.Name, tok.Role})
	if err != nil {
		return err
	}
	_, err = s.ledger.Append(ctx, auditd.Event{
		Type:      auditd.EventTokenChanged,
		Principal: by,
		Detail:    strings.TrimSpace(detail.String()),
	})
	if err != nil {
		return fmt.Errorf("record token %s %s: %w", action, tok.ID, err)
	}
	return nil
}
