package idem

import (
	"context"
	"fmt"
	"time"
)

// policyTimeout bounds reading and writing the policy at New.
const policyTimeout = 10 * time.Second

// adoptPolicy checks the Client's policy against the one the store holds,
// if it is a PolicyStore, and stores the Client's. A conflict is returned
// matching ErrPolicyConflict; any other error is the store's.
func (j *journal) adoptPolicy(p Policy) error {
	ps, ok := j.store.(PolicyStore)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), policyTimeout)
	defer cancel()
	stored, err := ps.Policy(ctx)
	if err != nil {
		return fmt.Errorf("idem: reading the journal's policy: %w", err)
	}
	if err := stored.Allows(p); err != nil {
		return err
	}
	if stored == p {
		return nil
	}
	if err := ps.SetPolicy(ctx, p); err != nil {
		return fmt.Errorf("idem: writing the journal's policy: %w", err)
	}
	return nil
}
