package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemstore"
)

var _ idemstore.Inspector = (*Store)(nil)

// inspectSQL returns a select of whole rows, without their replayable
// requests (header and body read as NULL), followed by where.
func (s *Store) inspectSQL(where string) string {
	sel := make([]byte, 0, 256)
	for i, c := range columns {
		if i > 0 {
			sel = append(sel, ", "...)
		}
		switch c {
		case "header", "body":
			sel = append(sel, "NULL::bytea"...)
		default:
			sel = append(sel, c...)
		}
	}
	return "SELECT " + string(sel) + " FROM " + pgx.Identifier{s.schema, "operations"}.Sanitize() + " " + where
}

// Named implements idemstore.Inspector: the record of an operation name, of
// any state, without its replayable request.
func (s *Store) Named(ctx context.Context, name string) (idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	ops, err := s.collect(ctx, "named", s.inspectSQL("WHERE name = $1"), name)
	switch {
	case len(ops) == 0 && err == nil:
		return idemstore.Operation{}, fmt.Errorf("pgstore: no operation named %q: %w", name, idemstore.ErrNotFound)
	case err != nil:
		return idemstore.Operation{}, err
	}
	return ops[0], nil
}

// Walk implements idemstore.Inspector: up to limit records of any state with
// keys after after, in key order, without their replayable requests. A
// row it cannot read is returned as Pending returns one.
func (s *Store) Walk(ctx context.Context, after string, limit int) ([]idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	return s.collect(ctx, "walk", s.inspectSQL("WHERE key > $1 ORDER BY key LIMIT $2"), after, limitArg(limit))
}
