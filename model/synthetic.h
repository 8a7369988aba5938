// Forwarding header: the fixture lives in model/testing/synthetic.h (include that path).
#pragma once

#include "model/testing/synthetic.h"
