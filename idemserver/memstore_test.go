package idemserver_test

import (
	"testing"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemserver/storetest"
)

func TestMemoryStore(t *testing.T) {
	storetest.Run(t, storetest.Config{Open: func(t *testing.T) idemserver.Store { return idemserver.NewMemoryStore() }})
}
