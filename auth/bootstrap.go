package auth

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// BootstrapEnv names the environment variable whose value, when set, becomes
// the first admin token's secret.
const BootstrapEnv = "AUDITD_BOOTSTRAP_TOKEN"

// BootstrapFile is the file in the data directory that receives a generated
// first admin secret, readable by its owner only.
const BootstrapFile = "bootstrap-token"

// BootstrapPrincipal names the service itself as the creator of the first
// admin token in the ledger.
const BootstrapPrincipal = "auditd bootstrap"

// Bootstrap gives an empty token store its first admin token, and does
// nothing when the store already holds a token (revoked ones count).
//
// When getenv(BootstrapEnv) is set, it is the secret and Bootstrap returns
// "": the operator already knows it. Otherwise Bootstrap generates a secret,
// writes it to BootstrapFile in dataDir with 0600 permissions, and returns
// it so that the caller prints it once. The file is written before the
// token is stored, so a crash in between leaves an empty store that the
// next start bootstraps again, never a token whose secret nobody has.
func Bootstrap(ctx context.Context, s *Store, dataDir string, getenv func(string) string) (string, error) {
	empty, err := s.Empty()
	if err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	} else if !empty {
		return "", nil
	}
	if secret := getenv(BootstrapEnv); secret != "" {
		if len(secret) < MinSecretLen {
			return "", fmt.Errorf("bootstrap: %s must be at least %d characters", BootstrapEnv, MinSecretLen)
		}
		if _, err := s.create(ctx, "bootstrap", RoleAdmin, BootstrapPrincipal, secret); err != nil {
			return "", fmt.Errorf("bootstrap: %w", err)
		}
		return "", nil
	}
	secret, err := s.newSecret()
	if err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	path := filepath.Join(dataDir, BootstrapFile)
	if err := writeSecret(path, secret); err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	if _, err := s.create(ctx, "bootstrap", RoleAdmin, BootstrapPrincipal, secret); err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	return secret, nil
}

// writeSecret writes secret to path with 0600 permissions, replacing a file
// left by an earlier, interrupted bootstrap, and syncs it.
func writeSecret(path, secret string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// A file left by an earlier run may have looser permissions.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
