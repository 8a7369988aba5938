// Forwarding header: the fixture lives in model/testing/test_util.h (include that path).
#pragma once

#include "model/testing/test_util.h"
