package pgstore_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// lpRole is the role with no privileges of its own that .ci/postgres
// creates (the test role's name and password with "_lp").
func lpDSN(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	pw, _ := u.User.Password()
	u.User = url.UserPassword(u.User.Username()+"_lp", pw+"_lp")
	conn, err := pgx.Connect(testContext(t), u.String())
	if err != nil {
		t.Skipf("no least-privilege role %s (.ci/postgres creates it): %v", u.User.Username(), err)
	}
	conn.Close(context.Background())
	return u.String()
}

// TestLeastPrivilege opens an already-migrated schema with a role that has
// only what the package documentation names (USAGE on the schema, SELECT,
// INSERT, UPDATE, DELETE on its tables): it opens and works. Without those
// grants, Open fails with ErrPermission, not ErrJournalWrite.
func TestLeastPrivilege(t *testing.T) {
	dsn := pgtest.DSN(t)
	lp := lpDSN(t, dsn)
	owner := openStore(t) // migrates the schema
	ctx := testContext(t)
	role := pgx.Identifier{mustUser(t, lp)}.Sanitize()
	schema := pgx.Identifier{owner.Schema()}.Sanitize()

	_, err := pgstore.Open(ctx, lp, pgstore.WithSchema(owner.Schema()))
	require.ErrorIs(t, err, pgstore.ErrPermission, "a role without grants")
	assert.NotErrorIs(t, err, idem.ErrJournalWrite, "a permission error is not taken for an unreachable database")

	_, err = owner.Pool().Exec(ctx, `GRANT USAGE ON SCHEMA `+schema+` TO `+role+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO `+role)
	require.NoError(t, err)
	s, err := pgstore.Open(ctx, lp, pgstore.WithSchema(owner.Schema()))
	require.NoError(t, err, "the documented privileges open a migrated schema")
	defer s.Close()
	_, created, err := s.Reserve(ctx, storetest.NewOperation("k1"))
	require.NoError(t, err)
	assert.True(t, created)

	_, err = owner.Pool().Exec(ctx, `REVOKE INSERT ON ALL TABLES IN SCHEMA `+schema+` FROM `+role)
	require.NoError(t, err)
	_, _, err = s.Reserve(ctx, storetest.NewOperation("k2"))
	assert.ErrorIs(t, err, pgstore.ErrPermission, "a refused privilege in a call")
	assert.ErrorIs(t, err, idem.ErrJournalWrite, "which fails closed like any journal error")
}

func mustUser(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u.User.Username()
}
