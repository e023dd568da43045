package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
)

var _ idem.Inspector = (*Store)(nil)

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

// Named implements idem.Inspector: the record of an operation name, of
// any state, without its replayable request.
func (s *Store) Named(ctx context.Context, name string) (idem.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return idem.Operation{}, err
	}
	ops, err := s.collect(ctx, "named", s.inspectSQL("WHERE name = $1"), name)
	switch {
	case len(ops) == 0 && err == nil:
		return idem.Operation{}, fmt.Errorf("pgstore: no operation named %q: %w", name, idem.ErrNotFound)
	case err != nil:
		return idem.Operation{}, err
	}
	return ops[0], nil
}

// Walk implements idem.Inspector: up to limit records of any state with
// keys after after, in key order, without their replayable requests. A
// row it cannot read is returned as Pending returns one.
func (s *Store) Walk(ctx context.Context, after string, limit int) ([]idem.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	return s.collect(ctx, "walk", s.inspectSQL("WHERE key > $1 ORDER BY key LIMIT $2"), after, limitArg(limit))
}
